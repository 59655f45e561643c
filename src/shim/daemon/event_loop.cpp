#include "event_loop.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "guest_fd.h"
#include "load_report.h"
#include "security_report.h"
#include "vrdma_common/guest_paths.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {

Daemon::Daemon(Options opts) : opts_(std::move(opts)), engine_(opts_.quotas) {
    engine_.guess_throttle().set_limit(opts_.rkey_guess_limit);
}

Daemon::~Daemon() { shutdown(); }

bool Daemon::epoll_add(int fd, uint32_t events, uint64_t data) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
}

void Daemon::epoll_del(int fd) {
    if (fd >= 0) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

bool Daemon::start(std::string& error) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    signal_fd_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!signal_fd_ || !epoll_ || !epoll_add(signal_fd_.get(), EPOLLIN, tag(kSignal, 0))) {
        error = std::string("cannot set up epoll/signalfd: ") + strerror(errno);
        return false;
    }
    // The device first: a wrong --hca fails before the run directory is touched.
    if (!opts_.hca.empty()) {
        hca_ = HcaDevice::open(opts_.hca, error);
        if (!hca_) return false;
        hca_transport_ = std::make_unique<HcaTransport>(*hca_);
        engine_.set_hca(hca_.get(), hca_transport_.get());
        if (opts_.hca_local) engine_.local_transport().set_device_gid(hca_->gid());
        if (!epoll_add(hca_->comp_fd(), EPOLLIN, tag(kHca, 0)) ||
            !epoll_add(hca_->async_fd(), EPOLLIN, tag(kHcaAsync, 0))) {
            error = std::string("epoll: ") + strerror(errno);
            return false;
        }
        LOG_INFO("hca: %s", hca_->describe().c_str());
        if (std::string advice = HcaDevice::memlock_advice(); !advice.empty())
            LOG_WARN("hca: %s", advice.c_str());
    }
    if (!run_dir_.acquire(opts_.run_dir, error)) return false;

    const uint64_t host = host_id();
    std::string line = "vrdma-shim: ready: guests";
    for (size_t i = 0; i < opts_.guests.size(); ++i) {
        const std::string& name = opts_.guests[i];
        const GuestIdentity& id =
            engine_.add_guest(name, uint16_t(opts_.lid_base + i), derive_guid(host, name),
                              i < opts_.controlled_qkeys.size() && opts_.controlled_qkeys[i]);
        if (i < opts_.pkeys.size() && !opts_.pkeys[i].empty()) engine_.set_pkeys(id, opts_.pkeys[i]);
        auto pub = std::make_unique<GuestPublication>();
        bool ok = pub->publish(run_dir_.path(), "/dev/infiniband", id, error);
        published_.push_back(std::move(pub));
        if (!ok) return false;
        if (opts_.access.size() <= i) opts_.access.resize(i + 1);  // default: the shim's own user
        const GuestAccess& access = opts_.access[i];
        UniqueFd lfd;
        if (!access.apply(guest_paths(run_dir_.path(), name).dir, true, error) ||
            !open_guest_socket(guest_paths(run_dir_.path(), name).socket, access, lfd, error))
            return false;
        if (!epoll_add(lfd.get(), EPOLLIN, tag(kListen, i))) {
            error = std::string("epoll: ") + strerror(errno);
            return false;
        }
        listeners_.push_back(std::move(lfd));
        line += " " + name + "(lid " + std::to_string(id.lid) + ")";
        LOG_INFO("guest %s: lid %u guid %s", name.c_str(), id.lid, format_guid(id.guid).c_str());
    }
    control_path_ = run_dir_.path() + "/" + kControlSocketName;
    if (!open_control_socket(control_path_, control_, error)) return false;
    if (!epoll_add(control_.get(), EPOLLIN, tag(kControl, 0))) {
        error = std::string("epoll: ") + strerror(errno);
        return false;
    }
    if (!opts_.fabric_listen.empty() || !opts_.fabric_peers.empty()) {
        fabric::FabricConfig fc;
        fc.listen = opts_.fabric_listen;
        fc.peers = opts_.fabric_peers;
        fc.key_file = opts_.fabric_key;
        fc.lid_first = uint16_t(opts_.lid_base);
        uint32_t count = opts_.lid_count ? opts_.lid_count : uint32_t(opts_.guests.size());
        fc.lid_last = uint16_t(opts_.lid_base + count - 1);
        if (!fabric_.start(fc, error)) return false;
        if (!epoll_add(fabric_.epoll_fd(), EPOLLIN, tag(kFabric, 0))) {
            error = std::string("epoll: ") + strerror(errno);
            return false;
        }
        line += " fabric lids " + std::to_string(fc.lid_first) + "-" + std::to_string(fc.lid_last);
    }
    if (hca_) line += " hca " + hca_->name() + ":" + std::to_string(hca_->port());
    if (!run_dir_.mark_ready(error)) return false;
    line += " run-dir " + run_dir_.path();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    return true;
}

void Daemon::run() {
    uint64_t idle_since = monotonic_ns();
    unsigned busy_passes = 0, idle_passes = 0;
    const bool fabric = fabric_.enabled();
    while (!stop_) {
        bool progress = engine_.poll_once();
        if (fabric) {
            fabric_.flush();       // what the requesters queued
            fabric_.poll_links();  // what the peers sent (other fabric events come through poll_events)
        }
        // After the links: a peer's announcement of a UD QP (hca_ud.h),
        // sent before that QP's first datagram, is read before the device
        // delivers the datagram.
        if (hca_) progress |= hca_->poll(engine_);
        reap_dead_contexts();
        if (progress) {
            idle_since = monotonic_ns();
            // Kicks of dormant contexts (engine.h) come through the epoll
            // too: looked at more often while there are any.
            if (++busy_passes % (engine_.dormant_count() ? 8 : 64) == 0) poll_events(0);
            continue;
        }
        uint64_t t = monotonic_ns();
        if (t - idle_since < kIdleSpinNs) {
            // With a fabric, every pass already reads its links (a syscall);
            // the epoll of the rest (connections, control, fabric accepts)
            // is looked at every 8th pass, a few microseconds apart.
            if (!fabric || ++idle_passes % 8 == 0) poll_events(0);
            sched_yield();
            continue;
        }
        // Going to sleep: announce it, then look at every ring once more so
        // that a doorbell rung before the announcement is not missed.
        engine_.set_sleeping(true);
        if (hca_) hca_->arm();  // a completion from now on makes comp_fd readable
        if (engine_.poll_once() || (hca_ && hca_->poll(engine_))) {
            engine_.set_sleeping(false);
            idle_since = monotonic_ns();
            continue;
        }
        int timeout_ms = -1;
        uint64_t dl = engine_.next_deadline_ns();
        if (uint64_t fdl = fabric_.next_deadline_ns(); fdl && (!dl || fdl < dl)) dl = fdl;
        if (dl) {
            t = monotonic_ns();
            if (dl <= t + 1'000'000) {  // too close to sleep on a millisecond timer
                engine_.set_sleeping(false);
                poll_events(0);
                sched_yield();
                continue;
            }
            timeout_ms = int((dl - t) / 1'000'000);
        }
        const uint64_t asleep_from = monotonic_ns();
        poll_events(timeout_ms);
        asleep_ns_ += monotonic_ns() - asleep_from;
        engine_.set_sleeping(false);
        idle_since = monotonic_ns();
    }
    shutdown();
}

std::string Daemon::transports_report() {
    char line[512];
    std::string out;
    std::snprintf(line, sizeof(line), "local copied_bytes %llu\n",
                  (unsigned long long)engine_.local_transport().copied_bytes());
    out += line;
    const fabric::LinkStats t = fabric_.totals();
    std::snprintf(line, sizeof(line), "tcp copied_bytes %llu\n", (unsigned long long)(t.tx_payload + t.rx_payload));
    out += line;
    if (hca_) {
        const HcaDevice::Stats& s = hca_->stats();
        std::snprintf(line, sizeof(line),
                      "hca %s:%u sends %llu send_bytes %llu recvs %llu completions %llu errors %llu copied_bytes 0"
                      " ud_lost %llu ud_unknown %llu\n",
                      hca_->name().c_str(), hca_->port(), (unsigned long long)s.sends,
                      (unsigned long long)s.send_bytes, (unsigned long long)s.recvs,
                      (unsigned long long)s.completions, (unsigned long long)s.errors,
                      (unsigned long long)s.ud_lost, (unsigned long long)s.ud_unknown);
        out += line;
    }
    return out;
}

void Daemon::poll_events(int timeout_ms) {
    epoll_event evs[64];
    int n = ::epoll_wait(epoll_.get(), evs, 64, timeout_ms);
    for (int i = 0; i < n; ++i) {
        uint64_t kind = evs[i].data.u64 >> 56, id = evs[i].data.u64 & ((1ull << 56) - 1);
        switch (kind) {
        case kSignal: {
            signalfd_siginfo si;
            while (::read(signal_fd_.get(), &si, sizeof(si)) == ssize_t(sizeof(si))) {
                LOG_INFO("signal %u: shutting down", si.ssi_signo);
                stop_ = true;
            }
            break;
        }
        case kListen:
            accept_all(id);
            break;
        case kConn:
            on_connection(id, evs[i].events);
            break;
        case kControl:
            accept_control();
            break;
        case kControlConn:
            on_control(id);
            break;
        case kFabric:
            fabric_.poll();
            break;
        case kHca:
            hca_->consume_events();  // the next pass polls the CQs
            break;
        case kHcaAsync:
            hca_->handle_async(engine_);
            break;
        case kKick: {
            auto it = conns_.find(id);
            if (it == conns_.end()) break;
            Context* ctx = engine_.find_context(it->second.ctx_id);
            uint64_t v;
            if (!ctx) break;
            ssize_t n = guest_fd_read(ctx->kick_fd(), &v, sizeof(v));
            ctx->check_blocked(n, "kick eventfd");  // EINTR: reaped as dead below
            engine_.wake(*ctx);  // a dormant context rang its doorbell
            if (n < 0 && errno != EAGAIN && errno != EINTR) close_connection(id);
            break;
        }
        }
    }
}

void Daemon::accept_all(size_t guest_index) {
    // At the fd limit the kernel keeps the connection queued and the
    // listener stays readable: the loop would spin. A spare fd is given up
    // to accept the connection and close it (the guest sees it refused).
    for (;;) {
        int fd = ::accept4(listeners_[guest_index].get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if ((errno == EMFILE || errno == ENFILE) && spare_fd_) {
                spare_fd_.reset();
                int refused = ::accept4(listeners_[guest_index].get(), nullptr, nullptr, SOCK_CLOEXEC);
                if (refused >= 0) ::close(refused);
                spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
                if (monotonic_ns() - last_fd_warning_ns_ > 1'000'000'000) {
                    last_fd_warning_ns_ = monotonic_ns();
                    LOG_WARN("guest %s: connection refused: the shim is out of file descriptors",
                             engine_.guests()[guest_index]->name.c_str());
                }
                if (refused >= 0) continue;
                return;
            }
            if (errno != EAGAIN && errno != EINTR) LOG_WARN("accept: %s", strerror(errno));
            return;
        }
        close_stale_connections();
        uint64_t id = next_conn_id_++;
        Connection& c = conns_[id];
        c.id = id;
        c.accepted_ns = monotonic_ns();
        c.guest = engine_.guests()[guest_index].get();
        c.sock.reset(fd);
        read_peer_credentials(c);
        if (!opts_.access[guest_index].allows(c.uid, c.gid)) {  // before anything is charged
            refuse_connection(c, opts_.access[guest_index], engine_.security_of(*c.guest));
            conns_.erase(id);
            continue;
        }
        c.charges.bind(engine_.usage_of(*c.guest));
        if (!c.charges.take(Res::Connections, 1, "a connection") || !c.charges.take(Res::Fds, 1, "a connection")) {
            conns_.erase(id);  // closes it: the guest sees EOF
            continue;
        }
        if (!epoll_add(fd, EPOLLIN | EPOLLRDHUP, tag(kConn, id))) {
            LOG_WARN("epoll: %s", strerror(errno));
            conns_.erase(id);
        }
    }
}

void Daemon::on_connection(uint64_t conn_id, uint32_t events) {
    auto it = conns_.find(conn_id);
    if (it == conns_.end()) return;
    Connection& c = it->second;
    if (events & EPOLLIN) {
        uint64_t before = c.ctx_id;
        if (!handle_connection_message(engine_, c)) {
            close_connection(conn_id);
            return;
        }
        if (!before && c.ctx_id) {
            Context* ctx = engine_.find_context(c.ctx_id);
            if (ctx && ctx->kick_fd() >= 0) epoll_add(ctx->kick_fd(), EPOLLIN, tag(kKick, conn_id));
        }
        return;
    }
    if (events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) close_connection(conn_id);
}

// Connections that never attached, past --attach-timeout, are closed when
// the next one arrives (that is when the quota they hold matters).
void Daemon::close_stale_connections() {
    const uint64_t now = monotonic_ns();
    const uint64_t limit = uint64_t(opts_.attach_timeout_s) * 1'000'000'000ull;
    std::vector<uint64_t> stale;
    for (auto& [id, c] : conns_)
        if (!c.ctx_id && now - c.accepted_ns > limit) stale.push_back(id);
    if (stale.empty()) return;
    LOG_WARN("closing %zu connection(s) that did not attach within %u s", stale.size(), opts_.attach_timeout_s);
    for (uint64_t id : stale) close_connection(id);
}

void Daemon::close_connection(uint64_t conn_id) {
    auto it = conns_.find(conn_id);
    if (it == conns_.end()) return;
    Connection& c = it->second;
    if (c.ctx_id) {
        // Unregister the kick eventfd before closing it: the guest still
        // holds the same open file, so close() alone would not remove it.
        if (Context* ctx = engine_.find_context(c.ctx_id)) epoll_del(ctx->kick_fd());
        engine_.detach(c.ctx_id);
    } else {
        LOG_INFO("guest %s: connection %llu closed", c.guest->name.c_str(), (unsigned long long)conn_id);
    }
    epoll_del(c.sock.get());
    conns_.erase(it);
}

void Daemon::reap_dead_contexts() {
    auto dead = engine_.dead_contexts();
    if (dead.empty()) return;
    for (uint64_t ctx_id : dead) {
        uint64_t conn_id = 0;
        for (auto& [id, c] : conns_)
            if (c.ctx_id == ctx_id) conn_id = id;
        if (conn_id) {
            close_connection(conn_id);
        } else {
            engine_.detach(ctx_id);
        }
    }
}

void Daemon::accept_control() {
    for (;;) {
        int fd = ::accept4(control_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR) LOG_WARN("accept (control): %s", strerror(errno));
            return;
        }
        if (control_conns_.size() >= 16) {  // the operator's tool sends one request at a time
            ::close(fd);
            continue;
        }
        uint64_t id = next_conn_id_++;
        if (!epoll_add(fd, EPOLLIN | EPOLLRDHUP, tag(kControlConn, id))) {
            ::close(fd);
            continue;
        }
        control_conns_[id].reset(fd);
        on_control(id);  // the request may be there already
    }
}

void Daemon::on_control(uint64_t id) {
    auto it = control_conns_.find(id);
    if (it == control_conns_.end()) return;
    ControlActions actions;
    actions.set_port = [this](const std::string& g, bool up, std::string& err) { return set_port(g, up, err); };
    actions.peers = [this] { return fabric_.enabled() ? fabric_.status() : std::string("no fabric\n"); };
    actions.counters = [this] { return security_report(engine_); };
    actions.load = [this] { return load_report(engine_, asleep_ns_, monotonic_ns() - started_ns_); };
    actions.transports = [this] { return transports_report(); };
    if (!handle_control_connection(it->second.get(), actions)) return;
    epoll_del(it->second.get());
    control_conns_.erase(it);
}

bool Daemon::set_port(const std::string& guest, bool up, std::string& error) {
    const auto& guests = engine_.guests();
    for (size_t i = 0; i < guests.size(); ++i) {
        if (guests[i]->name != guest) continue;
        if (i < published_.size() && !published_[i]->set_port_state(up, error)) return false;
        engine_.set_port_active(guest, up);
        return true;
    }
    error = "no guest named '" + guest + "'";
    return false;
}

void Daemon::shutdown() {
    if (shut_down_) return;
    shut_down_ = true;
    engine_.mark_all_fatal();
    while (!conns_.empty()) close_connection(conns_.begin()->first);
    for (auto& [id, fd] : control_conns_) epoll_del(fd.get());
    control_conns_.clear();
    if (control_) {
        epoll_del(control_.get());
        control_.reset();
        ::unlink(control_path_.c_str());
    }
    listeners_.clear();
    published_.clear();  // unpublishes each guest
    run_dir_.release();
}

}  // namespace vrdma::shim
