// A worker: one thread that serves a share of the shim's guests
// (docs/protocol.md "Workers"). It owns an engine with those guests'
// contexts, their socket connections and kick eventfds, and the links to
// the other workers (worker_link.h). The transports (transport_plugin.h)
// give it their poll groups: in a fabric its own connections to each
// worker of each peer shim, with an RDMA device its own context of it.
// Nothing a worker owns is touched by another thread: the daemon's thread
// hands it accepted connections and operator requests as tasks (post, call),
// and other workers reach its guests only through the links.
//
// The loop (run): a pass over every awake context, the links, and the
// transports' poll groups (poll_group.h: the fabric, the device), while
// there is work; with none, it keeps passing for kIdleSpinNs, yielding the
// CPU after each pass unless every runnable thread of the host has a core
// (core_census.h); then it announces that it sleeps (to its guests, in
// every control block, and to the other workers, in its WorkerWake), arms
// the poll groups, looks at everything once more so that nothing rung
// before the announcement is missed, and sleeps in epoll_wait on the kick
// eventfds, its connections, its wake eventfd and the poll groups' fds,
// until the earliest RNR, retry or poll group deadline. The loop names no
// transport.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attach.h"
#include "core_census.h"
#include "epoll_set.h"
#include "engine.h"
#include "options.h"
#include "poll_group.h"
#include "transport_plugin.h"
#include "vm_port.h"
#include "worker_link.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

class Worker final : public WorkerPort {
public:
    Worker(uint32_t index, const Options& opts, SharedTables& shared);
    ~Worker();
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;

    // Setup, before start (single-threaded).
    bool init(std::string& error);
    uint32_t index() const override { return index_; }
    Engine& engine() override { return engine_; }
    // The transports, told of each guest added (before start).
    void set_transports(std::vector<TransportPlugin*> transports) { transports_ = std::move(transports); }
    // WorkerPort: a transport's poll group (before start).
    bool add_poll_group(PollGroup& group, bool first, std::string& error) override;
    WorkerInbox& inbox() { return inbox_; }
    // Serves guest `guest_index` (of the options), whose identity its
    // engine holds. Before start, or at run time in the worker's thread.
    const GuestIdentity& add_guest(size_t guest_index, uint16_t lid, uint64_t guid, const GuestSettings& settings);
    // In the worker's thread (vrdmactl guest remove): its processes get
    // IBV_EVENT_DEVICE_FATAL and their connections close, which frees what
    // they held and errs their QPs' peers as when a guest dies; the guest's
    // LID is no longer routed. Returns how many connections were closed.
    size_t remove_guest(size_t guest_index);
    // In the worker's thread: `lid` (a guest of another worker) is gone.
    void unroute(uint16_t lid) { engine_.routes().remove_lid(lid); }
    // Guest `guest_index` (of the options), which this worker serves.
    const GuestIdentity& guest(size_t guest_index) const { return *guests_.at(guest_index); }
    // The link to worker `peer` (`workers` in all), made here; guest `lid`
    // of that worker is then reached through it (route_to).
    WorkerLink& link_to(uint32_t peer, uint32_t workers, WorkerInbox& peer_inbox);
    void route_to(uint16_t lid, uint32_t peer);
    // Each link, by the worker it reaches (null: this one).
    const std::vector<std::unique_ptr<WorkerLink>>& links() const { return links_; }

    // Runs the loop in a thread of its own until stop(), pinned to its CPU
    // of --worker-cpus if given (false with `error` if that fails).
    bool start(std::string& error);
    void stop();
    void join();

    // From the daemon's thread: `task` runs in the worker's thread, between
    // two passes.
    void post(std::function<void()> task) override;
    // From the daemon's thread: runs `f` in the worker's thread and returns
    // its result, or "" with `answered` false when the worker did not answer
    // within `timeout_ms`.
    std::string call(std::function<std::string()> f, int timeout_ms, bool& answered);

    // In the worker's thread (tasks): a connection to guest `guest_index`
    // the daemon accepted, with a shim-wide id.
    void adopt_connection(size_t guest_index, uint64_t id, UniqueFd fd);
    // In the worker's thread (tasks): a QEMU connected to VM guest
    // `guest_index`'s ivshmem.sock (vm_port.h).
    void adopt_vm(size_t guest_index, UniqueFd fd);
    // Seconds asleep since the start (vrdmactl load).
    uint64_t asleep_ns() const { return asleep_ns_; }
    // After stop (single-threaded again): the links go (they hold pins of
    // other workers' guests), before any worker's engine does.
    void drop_links();

    static constexpr uint64_t kIdleSpinNs = 100'000;

private:
    enum Kind : uint64_t { kConn = 1, kKick = 2, kWake = 3, kGroup = 4, kVm = 5 };
    static uint64_t tag(Kind k, uint64_t id) { return epoll_tag(k, id); }
    bool epoll_add(int fd, uint32_t events, uint64_t data);
    void epoll_del(int fd);
    [[gnu::noinline]] void run();  // noinline: scripts/bench-instructions.sh counts it by name
    [[gnu::noinline]] bool pass();
    bool poll_links();
    bool links_idle() const;
    void run_tasks();
    void poll_events(int timeout_ms);
    void on_connection(uint64_t conn_id, uint32_t events);
    void close_connection(uint64_t conn_id);
    void close_stale_connections();
    void reap_dead_contexts();
    // VM guest `guest_index`'s QEMU socket (`bell` false) or kick eventfd.
    void on_vm(size_t guest_index, bool bell, uint32_t events);
    void drop_vm(size_t guest_index, const char* why);
    void shutdown();

    uint32_t index_;
    const Options& opts_;
    Engine engine_;
    std::vector<TransportPlugin*> transports_;
    // The transports' poll groups (the fabric, the device), in the order
    // every pass polls them; and by the id their epoll tags carry (the
    // order they were added in).
    std::vector<PollGroup*> groups_, group_ids_;
    std::vector<std::unique_ptr<WorkerLink>> links_;  // by peer worker
    std::vector<WorkerLink*> link_ptrs_;             // the same, for receive_messages
    std::map<size_t, const GuestIdentity*> guests_;  // by index in the options
    std::map<size_t, GuestAccess> access_;           // who may use each of them
    std::map<size_t, std::unique_ptr<VmPort>> vms_;  // the VM guests among them
    std::map<uint64_t, Connection> conns_;
    UniqueFd epoll_;
    WorkerInbox inbox_;
    std::thread thread_;
    std::atomic<bool> stop_{false};
    std::mutex tasks_mutex_;
    std::vector<std::function<void()>> tasks_;
    std::atomic<bool> has_tasks_{false};
    uint64_t asleep_ns_ = 0;
    CoreCensus census_;  // whether an idle pass yields
};

}  // namespace vrdma::shim
