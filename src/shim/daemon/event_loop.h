// The daemon: run directory, published guests, sockets, and the event loop.
//
// Threading: one thread runs everything — accepting and serving sockets,
// commands, and the whole data path (send queues of every context, local
// transport into any other context's queues, the fabric's connections). No locks are needed, each
// context's commands and WQEs are processed in order, and the local
// transport can touch both guests' queues safely. On 2 cores this is the
// simplest correct design; sharding guests across worker threads can come
// later.
//
// Polling and sleeping (docs/protocol.md): the loop passes over every
// context while there is work; when a pass finds none it keeps passing,
// yielding the CPU with sched_yield() after each pass, for kIdleSpinNs. Then
// it sets shim_sleeping in every control block, checks all doorbells and
// rings once more, and only then sleeps in epoll_wait on the kick eventfds,
// sockets and the signalfd, until the earliest RNR/retry deadline.
#pragma once

#include <fcntl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attach.h"
#include "control_socket.h"
#include "engine.h"
#include "fabric.h"
#include "hca_device.h"
#include "hca_transport.h"
#include "options.h"
#include "run_dir.h"
#include "sysfs_publisher.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

class Daemon {
public:
    explicit Daemon(Options opts);
    ~Daemon();
    // Publishes everything and prints the ready line. Returns false with a
    // message when the shim cannot start (exit status 1).
    bool start(std::string& error);
    // Runs until SIGTERM or SIGINT; then shuts down cleanly.
    void run();
    void shutdown();

    static constexpr uint64_t kIdleSpinNs = 100'000;

private:
    enum Kind : uint64_t { kSignal = 1, kListen = 2, kConn = 3, kKick = 4, kControl = 5, kControlConn = 6, kFabric = 7,
                       kHca = 8, kHcaAsync = 9 };
    static uint64_t tag(Kind k, uint64_t id) { return (uint64_t(k) << 56) | id; }
    bool epoll_add(int fd, uint32_t events, uint64_t data);
    void epoll_del(int fd);
    void poll_events(int timeout_ms);
    void accept_all(size_t guest_index);
    void on_connection(uint64_t conn_id, uint32_t events);
    void close_connection(uint64_t conn_id);
    void close_stale_connections();
    void reap_dead_contexts();
    void accept_control();
    void on_control(uint64_t id);
    bool set_port(const std::string& guest, bool up, std::string& error);
    std::string transports_report();

    Options opts_;
    // The RDMA device (--hca), before the engine: it outlives the guests'
    // device objects.
    std::unique_ptr<HcaDevice> hca_;
    std::unique_ptr<HcaTransport> hca_transport_;
    Engine engine_;
    fabric::Fabric fabric_{engine_};
    RunDir run_dir_;
    std::vector<std::unique_ptr<GuestPublication>> published_;
    std::vector<UniqueFd> listeners_;
    std::map<uint64_t, Connection> conns_;
    UniqueFd control_;                           // RUN_DIR/control.sock
    std::string control_path_;
    std::map<uint64_t, UniqueFd> control_conns_;  // operator connections awaiting their request
    uint64_t next_conn_id_ = 1;
    UniqueFd epoll_, signal_fd_;
    bool stop_ = false;
    const uint64_t started_ns_ = monotonic_ns();  // vrdmactl load: uptime
    uint64_t asleep_ns_ = 0;                      // in epoll_wait with nothing to do
    bool shut_down_ = false;
    // Held in reserve and given up at the fd limit to refuse a connection
    // (see accept_all); opened at start so the shim's fd count is stable.
    UniqueFd spare_fd_{::open("/dev/null", O_RDONLY | O_CLOEXEC)};
    uint64_t last_fd_warning_ns_ = 0;  // accept_all: one warning a second
};

}  // namespace vrdma::shim
