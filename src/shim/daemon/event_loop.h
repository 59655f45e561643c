// The daemon: run directory, published guests, sockets, and the threads.
//
// Threading (docs/protocol.md "Workers"): the daemon's own thread (run)
// is the control plane. It sleeps in epoll_wait on the signalfd, the
// guests' listening sockets and the operator's control socket, never
// polls, and touches no guest's state: it accepts a connection and hands
// it to the worker that serves the guest (worker.h), and answers vrdmactl
// by asking each worker in its thread. The data path (commands, send
// queues, the transports, the fabric and the device) runs in the workers,
// each over its own guests, with no lock shared between them on their
// fast paths.
#pragma once

#include <fcntl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cm_service.h"
#include "control_socket.h"
#include "epoll_set.h"
#include "options.h"
#include "run_dir.h"
#include "shared_tables.h"
#include "sysfs_publisher.h"
#include "transport_plugin.h"
#include "transport_registry.h"
#include "worker.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

class Daemon {
public:
    explicit Daemon(Options opts);
    ~Daemon();
    // Publishes everything, starts the workers and prints the ready line.
    // Returns false with a message when the shim cannot start (exit
    // status 1).
    bool start(std::string& error);
    // Runs until SIGTERM or SIGINT; then shuts down cleanly.
    void run();
    void shutdown();

    // How long the daemon waits for a worker to answer vrdmactl.
    static constexpr int kWorkerAnswerMs = 5000;

private:
    enum Kind : uint64_t {
        kSignal = 1, kListen = 2, kControl = 3, kControlConn = 4, kMetrics = 5, kMetricsConn = 6,
        kCmListen = 7,  // a guest's rdma_cm.sock
        kCmConn = 8,    // one of its connections (a channel of the CM)
        kInbox = 9,     // tasks the workers give this thread
        kCmTimer = 10,  // the CM's next timeout
        kVmListen = 11, // a VM guest's ivshmem.sock
    };
    static uint64_t tag(Kind k, uint64_t id) { return epoll_tag(k, id); }
    bool epoll_add(int fd, uint32_t events, uint64_t data);
    void epoll_del(int fd);
    void poll_events(int timeout_ms);
    void accept_all(size_t guest_index);
    // rdma_cm (cm/): connections to guest `i`'s rdma_cm.sock, served in
    // this thread by cm_.
    void accept_cm(size_t guest_index);
    void accept_vm(size_t guest_index);
    void on_cm(uint64_t channel);
    // From a worker's thread: `task` runs in the daemon's (rdma_cm: what
    // worker 0's fabric received for the CM, and its peers coming and going).
    void post(std::function<void()> task);
    void run_posted();
    // The transports the options ask for, opened with every worker.
    bool open_transports(std::string& error);
    // rdma_cm across hosts: the CM's outbox, and the hooks of the transport
    // that carries its messages to peer shims (none: the CM is local).
    bool connect_cm_to_peers(std::string& error);
    // ask_workers for the transports' reports.
    AskWorkers ask_ports();
    void arm_cm_timer();  // to the CM's next deadline, after anything it did
    // Accepts what waits on `listener` (the control socket, the metrics
    // port): each connection gets an id, is watched as `kind` and is handed
    // to `keep`; past 16 held (`held`) it is closed at once.
    void accept_watched(int listener, const char* what, Kind kind, const std::function<size_t()>& held,
                        const std::function<void(uint64_t, int)>& keep);
    void accept_control();
    void on_control(uint64_t id);
    // The options' index of guest `name`, or -1 with `error` set.
    int guest_index(const std::string& name, std::string& error) const;
    // Runs `task` in worker `w`'s thread and waits for it (kWorkerAnswerMs);
    // false with `error` set when the worker did not answer.
    bool call_worker(Worker& w, std::function<std::string()> task, std::string& error);
    bool set_port(const std::string& guest, bool up, std::string& error);
    // Guest `i` (its identity `id`, made by its worker): its device tree,
    // its socket, and the socket watched by this thread.
    bool publish_guest(size_t i, const GuestIdentity& id, std::string& error);
    // The lowest LID of this shim's range that no guest has (0: none).
    uint16_t free_lid() const;
    // vrdmactl guest add SPEC (as --guest): a new guest, served from now on.
    // Its line for the operator, or "" with `error` set.
    std::string add_guest(const std::string& spec, std::string& error);
    // vrdmactl guest remove NAME: its processes get IBV_EVENT_DEVICE_FATAL,
    // its peers' QPs errors, its memory and objects are freed and its
    // published files go; nothing else is disturbed.
    bool remove_guest(const std::string& name, std::string& error);
    // Guest `i`'s place in the options stays; its name and LID are free again.
    void forget_guest(size_t i);
    // vrdmactl reload and SIGHUP (reload.cpp): the --config file read again;
    // what was applied and what was refused, one line each, `ok` false if
    // anything was refused.
    std::string reload(bool& ok);
    // vrdmactl weight GUEST W: the guest's share of its worker from now on.
    bool set_weight(const std::string& guest, const std::string& weight, std::string& error);
    // Asks every worker, in its thread, for its two parts of a report
    // (`first`, `second`); returns every worker's first part, in worker
    // order, then every second part (for reports whose lines go by kind:
    // workers, then guests). A worker that does not answer is named.
    using WorkerReport = std::function<void(Worker&, std::string& first, std::string& second)>;
    std::string ask_workers(const WorkerReport& report);
    std::string transports_report();
    std::string load_report_all();
    std::string counters_report();
    // --metrics-listen: the listener, its connections, and the exposition.
    bool open_metrics(std::string& error);
    void accept_metrics();
    void on_metrics(uint64_t id);
    std::string metrics_text();

    Options opts_;
    // The transports the options asked for (transport_registry.h), before
    // the workers: what the guests' objects hold of them (a device)
    // outlives the workers; what refers to an engine goes at close().
    std::vector<std::unique_ptr<TransportPlugin>> transports_;
    ShimFacts shim_facts_;
    SharedTables shared_;
    std::vector<std::unique_ptr<Worker>> workers_;
    std::vector<uint32_t> worker_of_;  // by guest index
    std::vector<uint16_t> lids_;       // by guest index; 0: removed
    std::set<std::string> from_config_;  // guests of the command line and --config file (reload removes them)
    RunDir run_dir_;
    std::vector<std::unique_ptr<GuestPublication>> published_;
    std::vector<UniqueFd> listeners_;
    std::vector<UniqueFd> cm_listeners_;  // by guest index: RUN_DIR/NAME/rdma_cm.sock
    std::vector<UniqueFd> vm_listeners_;  // by guest index: RUN_DIR/NAME/ivshmem.sock of a VM guest
    cm::CmService cm_;
    std::mutex posted_mutex_;
    std::vector<std::function<void()>> posted_;
    UniqueFd posted_fd_;  // an eventfd: tasks wait in posted_
    // CM messages from peer shims waiting in posted_: past kMaxPostedCm a
    // flooding peer's messages are dropped.
    static constexpr uint32_t kMaxPostedCm = 4096;
    std::atomic<uint32_t> posted_cm_{0};
    std::atomic<uint64_t> posted_cm_dropped_{0};
    UniqueFd cm_timer_;   // a timerfd at the CM's next deadline
    uint64_t cm_timer_armed_ns_ = 0;
    UniqueFd control_;                           // RUN_DIR/control.sock
    std::string control_path_;
    std::map<uint64_t, UniqueFd> control_conns_;  // operator connections awaiting their request
    UniqueFd metrics_;                            // --metrics-listen
    struct MetricsConn {
        UniqueFd fd;
        std::string head;  // the request as read so far
    };
    std::map<uint64_t, MetricsConn> metrics_conns_;
    uint64_t next_conn_id_ = 1;
    UniqueFd epoll_, signal_fd_;
    bool stop_ = false;
    bool started_ = false;                        // the workers run
    const uint64_t started_ns_ = monotonic_ns();  // vrdmactl load: uptime
    bool shut_down_ = false;
    // Held in reserve and given up at the fd limit to refuse a connection
    // (see accept_all); opened at start so the shim's fd count is stable.
    UniqueFd spare_fd_{::open("/dev/null", O_RDONLY | O_CLOEXEC)};
    uint64_t last_fd_warning_ns_ = 0;  // accept_all: one warning a second
};

}  // namespace vrdma::shim
