#include "event_loop.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "epoll_set.h"
#include "guest_fd.h"
#include "load_report.h"
#include "metrics.h"
#include "sd_notify.h"
#include "security_report.h"
#include "vrdma_common/guest_paths.h"
#include "vrdma_common/ipv4_endpoint.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {

Daemon::Daemon(Options opts) : opts_(std::move(opts)) {
    shared_.guess_throttle().set_limit(opts_.rkey_guess_limit);
    shared_.qkey_throttle().set_limit(opts_.qkey_guess_limit);
}

Daemon::~Daemon() { shutdown(); }

bool Daemon::epoll_add(int fd, uint32_t events, uint64_t data) { return epoll_watch(epoll_.get(), fd, events, data); }

void Daemon::epoll_del(int fd) { epoll_unwatch(epoll_.get(), fd); }

bool Daemon::start(std::string& error) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    signal_fd_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    posted_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    cm_timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    if (!signal_fd_ || !epoll_ || !posted_fd_ || !cm_timer_ || !epoll_add(signal_fd_.get(), EPOLLIN, tag(kSignal, 0)) ||
        !epoll_add(posted_fd_.get(), EPOLLIN, tag(kInbox, 0)) || !epoll_add(cm_timer_.get(), EPOLLIN, tag(kCmTimer, 0))) {
        error = std::string("cannot set up epoll/signalfd: ") + strerror(errno);
        return false;
    }
    const uint32_t nworkers = opts_.workers ? opts_.workers : 1;
    for (uint32_t w = 0; w < nworkers; ++w) {
        workers_.push_back(std::make_unique<Worker>(w, opts_, shared_));
        if (!workers_.back()->init(error)) return false;
    }
    // The transports the options ask for open first: a wrong --hca fails
    // before the run directory is touched.
    if (!open_transports(error)) return false;
    if (!run_dir_.acquire(opts_.run_dir, error)) return false;

    const uint64_t host = host_id();
    std::string line = "vrdma-shim: ready: guests";
    if (opts_.access.size() < opts_.guests.size()) opts_.access.resize(opts_.guests.size());  // default: the shim's user
    for (size_t i = 0; i < opts_.guests.size(); ++i) {
        const std::string& name = opts_.guests[i];
        const uint32_t w = worker_of_guest(opts_, i);
        worker_of_.push_back(w);
        lids_.push_back(uint16_t(opts_.lid_base + i));
        const GuestIdentity& id =
            workers_[w]->add_guest(i, lids_[i], derive_guid(host, name), guest_settings(opts_, i));
        if (!publish_guest(i, id, error)) return false;
        from_config_.insert(name);
        line += " " + name + "(lid " + std::to_string(id.lid) + ")";
        LOG_INFO("guest %s: lid %u guid %s worker %u", name.c_str(), id.lid, format_guid(id.guid).c_str(), w);
    }
    // Every worker reaches the guests of every other through a link.
    if (nworkers > 1) {
        for (uint32_t a = 0; a < nworkers; ++a)
            for (uint32_t b = 0; b < nworkers; ++b)
                if (a != b) workers_[a]->link_to(b, nworkers, workers_[b]->inbox());
        for (size_t i = 0; i < opts_.guests.size(); ++i)
            for (uint32_t a = 0; a < nworkers; ++a)
                if (a != worker_of_[i]) workers_[a]->route_to(uint16_t(opts_.lid_base + i), worker_of_[i]);
    }
    if (!opts_.metrics_listen.empty() && !open_metrics(error)) return false;
    control_path_ = run_dir_.path() + "/" + kControlSocketName;
    if (!open_control_socket(run_dir_.fd(), control_path_, control_, error)) return false;
    if (!epoll_add(control_.get(), EPOLLIN, tag(kControl, 0))) {
        error = std::string("epoll: ") + strerror(errno);
        return false;
    }
    if (!connect_cm_to_peers(error)) return false;
    for (auto& t : transports_) {
        if (!t->start(shim_facts_, error)) return false;
        line += t->ready_words();
    }
    if (!run_dir_.mark_ready(error)) return false;
    if (nworkers > 1) line += " workers " + std::to_string(nworkers);
    line += " run-dir " + run_dir_.path();
    for (auto& w : workers_)
        if (!w->start(error)) return false;
    started_ = true;
    for (size_t w = 0; w < opts_.worker_cpus.size(); ++w)
        LOG_INFO("worker %zu: pinned to CPU %u", w, opts_.worker_cpus[w]);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (!sd_notify("READY=1\nSTATUS=serving " + std::to_string(opts_.guests.size()) + " guest(s) in " +
                   run_dir_.path() + "\nMAINPID=" + std::to_string(::getpid())))
        LOG_WARN("cannot tell the service manager that the shim is ready ($NOTIFY_SOCKET)");
    return true;
}

void Daemon::run() {
    while (!stop_) poll_events(-1);
    shutdown();
}

std::string Daemon::ask_workers(const WorkerReport& report) {
    std::string first, second;
    for (auto& w : workers_) {
        Worker* worker = w.get();
        bool answered = false;
        // By value: a worker that answers late runs it after this returned.
        std::string text = worker->call(
            [report, worker] {
                std::string a, b;
                report(*worker, a, b);
                return a + '\x1e' + b;  // the two parts, apart
            },
            kWorkerAnswerMs, answered);
        if (!answered) {
            first += "error: worker " + std::to_string(worker->index()) + " did not answer\n";
            continue;
        }
        const size_t cut = text.find('\x1e');
        first += text.substr(0, cut);
        second += text.substr(cut + 1);
    }
    return first + second;
}

std::string Daemon::transports_report() {
    char line[512];
    std::string out = ask_workers([](Worker& w, std::string& text, std::string&) {
        text = std::to_string(w.engine().local_transport().copied_bytes()) + "\n";
    });
    uint64_t local = 0;
    for (size_t pos = 0; pos < out.size();) {
        local += std::strtoull(out.c_str() + pos, nullptr, 10);
        pos = out.find('\n', pos);
        if (pos == std::string::npos) break;
        ++pos;
    }
    std::snprintf(line, sizeof(line), "local copied_bytes %llu\n", (unsigned long long)local);
    std::string report = line;
    if (workers_.size() > 1)
        report += ask_workers([](Worker& w, std::string& text, std::string&) {
            char l[256];
            for (auto& link : w.links()) {
                if (!link) continue;
                const WorkerLink::Stats& s = link->stats();
                std::snprintf(l, sizeof(l),
                              "worker %u->%u requests %llu copied_bytes %llu ring_full %llu\n", w.index(),
                              link->peer(), (unsigned long long)s.requests_out,
                              (unsigned long long)s.copied_bytes, (unsigned long long)s.ring_full);
                text += l;
            }
        });
    // Each transport's figures of every worker, added up.
    for (auto& t : transports_) report += t->counters(ask_ports());
    return report;
}

std::string Daemon::load_report_all() {
    const uint64_t uptime = monotonic_ns() - started_ns_;
    return ask_workers([uptime](Worker& w, std::string& workers, std::string& guests) {
        load_report(w.engine(), w.index(), w.asleep_ns(), uptime, workers, guests);
    });
}

std::string Daemon::metrics_text() {
    std::string samples = ask_workers([this](Worker& w, std::string& text, std::string&) {
        metrics_samples(w.engine(), w.index(), w.asleep_ns(), text);
        for (auto& t : transports_) t->metric_samples(w, text);
    });
    std::vector<MetricFamily> families;
    for (auto& t : transports_)
        for (const MetricFamily& f : t->metric_families()) families.push_back(f);
    return metrics_exposition(samples, monotonic_ns() - started_ns_, families);
}

bool Daemon::open_metrics(std::string& error) {
    sockaddr_in addr{};
    if (!parse_endpoint(opts_.metrics_listen, addr, error)) return false;
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    const int one = 1;
    if (!fd || ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd.get(), 16) != 0 ||
        !epoll_add(fd.get(), EPOLLIN, tag(kMetrics, 0))) {
        error = "--metrics-listen " + opts_.metrics_listen + ": " + strerror(errno);
        return false;
    }
    metrics_ = std::move(fd);
    LOG_INFO("metrics: http://%s/metrics", opts_.metrics_listen.c_str());
    return true;
}

void Daemon::accept_watched(int listener, const char* what, Kind kind, const std::function<size_t()>& held,
                            const std::function<void(uint64_t, int)>& keep) {
    for (;;) {
        int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR) LOG_WARN("accept (%s): %s", what, strerror(errno));
            return;
        }
        // One request at a time is all an operator's tool or a scraper sends.
        if (held() >= 16) {
            ::close(fd);
            continue;
        }
        const uint64_t id = next_conn_id_++;
        if (!epoll_add(fd, EPOLLIN | EPOLLRDHUP, tag(kind, id))) {
            ::close(fd);
            continue;
        }
        keep(id, fd);
    }
}

void Daemon::accept_metrics() {
    accept_watched(
        metrics_.get(), "metrics", kMetricsConn, [this] { return metrics_conns_.size(); },
        [this](uint64_t id, int fd) { metrics_conns_[id].fd.reset(fd); });
}

void Daemon::on_metrics(uint64_t id) {
    auto it = metrics_conns_.find(id);
    if (it == metrics_conns_.end()) return;
    MetricsConn& c = it->second;
    char buf[2048];
    bool done = false;
    for (;;) {
        ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
        if (n > 0) {
            c.head.append(buf, size_t(n));
            if (c.head.size() > 8192) done = true;  // no request head is that long: answered 400 below
            if (c.head.find("\r\n\r\n") != std::string::npos || c.head.find("\n\n") != std::string::npos) done = true;
            if (!done) continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            return;  // the rest of the request later
        }
        break;  // EOF, error, or a whole head
    }
    if (done) {
        const std::string response = metrics_http_response(c.head, [this] { return metrics_text(); });
        // Small, and the socket's buffer takes it; a reader that stalls for
        // a second loses the rest rather than stalling the control thread.
        size_t sent = 0;
        const uint64_t deadline = monotonic_ns() + 1'000'000'000ull;
        while (sent < response.size() && monotonic_ns() < deadline) {
            ssize_t n = ::send(c.fd.get(), response.data() + sent, response.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                sent += size_t(n);
            } else if (n < 0 && errno == EAGAIN) {
                pollfd p{c.fd.get(), POLLOUT, 0};
                ::poll(&p, 1, 100);
            } else {
                break;
            }
        }
    }
    epoll_del(c.fd.get());
    metrics_conns_.erase(it);
}

std::string Daemon::counters_report() {
    return ask_workers(
        [](Worker& w, std::string& guests, std::string& qps) { security_report(w.engine(), guests, qps); });
}

void Daemon::poll_events(int timeout_ms) {
    epoll_dispatch(epoll_.get(), timeout_ms, [this](uint64_t kind, uint64_t id, uint32_t) {
        switch (kind) {
        case kSignal: {
            signalfd_siginfo si;
            while (::read(signal_fd_.get(), &si, sizeof(si)) == ssize_t(sizeof(si))) {
                if (si.ssi_signo == SIGHUP) {
                    LOG_INFO("SIGHUP: reloading %s", opts_.config_file.empty() ? "(no --config)"
                                                                              : opts_.config_file.c_str());
                    bool ok;
                    sd_notify("RELOADING=1\nSTATUS=reloading " + opts_.config_file);
                    std::string text = reload(ok);  // reload() logs what it did
                    sd_notify(std::string("READY=1\nSTATUS=") + (ok ? "reloaded" : "reloaded, some changes refused"));
                    if (opts_.config_file.empty()) LOG_WARN("SIGHUP: %s", text.c_str());
                    continue;
                }
                LOG_INFO("signal %u: shutting down", si.ssi_signo);
                stop_ = true;
            }
            break;
        }
        case kListen:
            accept_all(id);
            break;
        case kControl:
            accept_control();
            break;
        case kControlConn:
            on_control(id);
            break;
        case kMetrics:
            accept_metrics();
            break;
        case kMetricsConn:
            on_metrics(id);
            break;
        case kCmListen:
            accept_cm(id);
            break;
        case kVmListen:
            accept_vm(id);
            break;
        case kCmConn:
            on_cm(id);
            break;
        case kInbox:
            run_posted();
            arm_cm_timer();
            break;
        case kCmTimer: {
            uint64_t n;
            (void)!::read(cm_timer_.get(), &n, sizeof(n));
            cm_timer_armed_ns_ = 0;
            cm_.on_timer(monotonic_ns());
            arm_cm_timer();
            break;
        }
        }
    });
}

void Daemon::accept_all(size_t guest_index) {
    if (guest_index >= listeners_.size() || !listeners_[guest_index]) return;  // removed in this same wake-up
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
                             opts_.guests[guest_index].c_str());
                }
                if (refused >= 0) continue;
                return;
            }
            if (errno != EAGAIN && errno != EINTR) LOG_WARN("accept: %s", strerror(errno));
            return;
        }
        // The guest's worker checks the peer and charges the connection.
        Worker& w = *workers_[worker_of_[guest_index]];
        const uint64_t id = next_conn_id_++;
        w.post([&w, guest_index, id, fd] { w.adopt_connection(guest_index, id, UniqueFd(fd)); });
    }
}

void Daemon::accept_control() {
    accept_watched(
        control_.get(), "control", kControlConn, [this] { return control_conns_.size(); },
        [this](uint64_t id, int fd) {
            control_conns_[id].reset(fd);
            on_control(id);  // the request may be there already
        });
}

void Daemon::on_control(uint64_t id) {
    auto it = control_conns_.find(id);
    if (it == control_conns_.end()) return;
    ControlActions actions;
    actions.set_port = [this](const std::string& g, bool up, std::string& err) { return set_port(g, up, err); };
    actions.set_weight = [this](const std::string& g, const std::string& w, std::string& err) {
        return set_weight(g, w, err);
    };
    actions.peers = [this] {
        std::string text;
        for (auto& t : transports_) text += t->peers(ask_ports());
        return text.empty() ? std::string("no fabric\n") : text;
    };
    actions.counters = [this] { return counters_report(); };
    actions.add_guest = [this](const std::string& spec, std::string& err) { return add_guest(spec, err); };
    actions.remove_guest = [this](const std::string& g, std::string& err) { return remove_guest(g, err); };
    actions.reload = [this](bool& ok) { return reload(ok); };
    actions.load = [this] { return load_report_all(); };
    actions.transports = [this] { return transports_report(); };
    if (!handle_control_connection(it->second.get(), actions)) return;
    epoll_del(it->second.get());
    control_conns_.erase(it);
}

int Daemon::guest_index(const std::string& name, std::string& error) const {
    for (size_t i = 0; i < opts_.guests.size(); ++i)
        if (!name.empty() && opts_.guests[i] == name) return int(i);  // a removed guest's name is ""
    error = "no guest named '" + name + "'";
    return -1;
}

bool Daemon::publish_guest(size_t i, const GuestIdentity& id, std::string& error) {
    if (published_.size() <= i) published_.resize(i + 1);
    if (listeners_.size() <= i) listeners_.resize(i + 1);
    auto pub = std::make_unique<GuestPublication>();
    bool ok = pub->publish(run_dir_.fd(), run_dir_.path(), "/dev/infiniband", id, error);
    published_[i] = std::move(pub);
    if (!ok) return false;
    UniqueFd lfd;
    if (!open_guest_socket(published_[i]->guest_dir_fd(), guest_paths(run_dir_.path(), id.name).socket,
                           opts_.access[i], lfd, error))
        return false;
    if (!epoll_add(lfd.get(), EPOLLIN, tag(kListen, i))) {
        error = std::string("epoll: ") + strerror(errno);
        return false;
    }
    listeners_[i] = std::move(lfd);

    if (cm_listeners_.size() <= i) cm_listeners_.resize(i + 1);
    UniqueFd cfd;
    const std::string cm_path = guest_paths(run_dir_.path(), id.name).dir + "/" + abi::kCmSocketName;
    if (!open_guest_socket(published_[i]->guest_dir_fd(), cm_path, opts_.access[i], cfd, error)) return false;
    if (!epoll_add(cfd.get(), EPOLLIN, tag(kCmListen, i))) {
        error = std::string("epoll: ") + strerror(errno);
        return false;
    }
    cm_listeners_[i] = std::move(cfd);
    if (vm_listeners_.size() <= i) vm_listeners_.resize(i + 1);
    if (i < opts_.vm_memory.size() && opts_.vm_memory[i]) {
        // A VM guest: its QEMU connects here (vm_port.h).
        UniqueFd vfd;
        const std::string vm_path = guest_paths(run_dir_.path(), id.name).dir + "/" + abi::kVmSocketName;
        if (!open_guest_socket(published_[i]->guest_dir_fd(), vm_path, opts_.access[i], vfd, error, SOCK_STREAM))
            return false;
        if (!epoll_add(vfd.get(), EPOLLIN, tag(kVmListen, i))) {
            error = std::string("epoll: ") + strerror(errno);
            return false;
        }
        vm_listeners_[i] = std::move(vfd);
    }
    cm::CmGuest g;
    g.name = id.name;
    g.lid = id.lid;
    g.guid = id.guid;
    g.pkey = id.pkeys.empty() ? 0xffff : id.pkeys[0];
    if (i < opts_.addresses.size()) g.addrs = opts_.addresses[i];
    cm_.set_guest(i, std::move(g));
    return true;
}

// A QEMU for VM guest `guest_index`: handed to the guest's worker, which
// checks who it is and serves the VM (vm_port.h).
void Daemon::accept_vm(size_t guest_index) {
    if (guest_index >= vm_listeners_.size() || !vm_listeners_[guest_index]) return;
    for (;;) {
        int fd = ::accept4(vm_listeners_[guest_index].get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR) LOG_WARN("accept (ivshmem): %s", strerror(errno));
            return;
        }
        Worker& w = *workers_[worker_of_[guest_index]];
        w.post([&w, guest_index, fd] { w.adopt_vm(guest_index, UniqueFd(fd)); });
    }
}

void Daemon::accept_cm(size_t guest_index) {
    if (guest_index >= cm_listeners_.size() || !cm_listeners_[guest_index]) return;
    for (;;) {
        int fd = ::accept4(cm_listeners_[guest_index].get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR) LOG_WARN("accept (rdma_cm): %s", strerror(errno));
            return;  // at the fd limit the guest's own socket's spare-fd dance is not repeated: it retries
        }
        UniqueFd sock(fd);
        ucred cred{};
        socklen_t len = sizeof(cred);
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
            !opts_.access[guest_index].allows(cred.uid, cred.gid)) {
            LOG_WARN("guest %s: rdma_cm connection from pid %d uid %u refused: only %s and root may use this guest",
                     opts_.guests[guest_index].c_str(), int(cred.pid), unsigned(cred.uid),
                     opts_.access[guest_index].describe().c_str());
            continue;  // closed: librdmacm's open() fails
        }
        const uint64_t channel = cm_.add_connection(guest_index, std::move(sock));
        if (!channel) {
            LOG_WARN("guest %s: rdma_cm connection from pid %d refused: the guest holds %u channels",
                     opts_.guests[guest_index].c_str(), int(cred.pid), cm::CmService::kMaxChannels);
            continue;
        }
        if (!epoll_add(cm_.socket_of(channel), EPOLLIN | EPOLLRDHUP, tag(kCmConn, channel))) cm_.close_channel(channel);
    }
}

void Daemon::on_cm(uint64_t channel) {
    if (!cm_.on_readable(channel)) cm_.close_channel(channel);  // closing the socket takes it out of epoll
    arm_cm_timer();
}

void Daemon::arm_cm_timer() {
    const uint64_t due = cm_.next_deadline_ns();
    if (due == cm_timer_armed_ns_ || !cm_timer_) return;
    itimerspec its{};
    if (due) {
        its.it_value.tv_sec = time_t(due / 1'000'000'000);
        its.it_value.tv_nsec = long(due % 1'000'000'000);
    }
    if (::timerfd_settime(cm_timer_.get(), TFD_TIMER_ABSTIME, &its, nullptr) == 0) cm_timer_armed_ns_ = due;
}

void Daemon::post(std::function<void()> task) {
    {
        std::lock_guard lock(posted_mutex_);
        posted_.push_back(std::move(task));
    }
    const uint64_t one = 1;
    (void)!::write(posted_fd_.get(), &one, sizeof(one));
}

void Daemon::run_posted() {
    uint64_t n;
    (void)!::read(posted_fd_.get(), &n, sizeof(n));
    std::vector<std::function<void()>> tasks;
    {
        std::lock_guard lock(posted_mutex_);
        tasks.swap(posted_);
    }
    for (auto& t : tasks) t();
}

// The transports the options ask for (transport_registry.h), each opened
// with every worker.
bool Daemon::open_transports(std::string& error) {
    shim_facts_.workers.clear();
    for (auto& w : workers_) shim_facts_.workers.push_back(w.get());
    shim_facts_.lid_first = uint16_t(opts_.lid_base);
    const uint32_t count = opts_.lid_count ? opts_.lid_count : uint32_t(opts_.guests.size());
    shim_facts_.lid_last = uint16_t(opts_.lid_base + count - 1);
    for (const TransportFactory* f : transport_factories())
        if (auto t = f->make(opts_.transport_args)) transports_.push_back(std::move(t));
    std::vector<TransportPlugin*> all;
    for (auto& t : transports_) {
        if (!t->open(shim_facts_, error)) return false;
        all.push_back(t.get());
    }
    for (auto& w : workers_) w->set_transports(all);
    return true;
}

AskWorkers Daemon::ask_ports() {
    return [this](const std::function<void(WorkerPort&, std::string&)>& f) {
        return ask_workers([f](Worker& w, std::string& text, std::string&) { f(w, text); });
    };
}

// rdma_cm across hosts: the CM's messages to a peer shim leave through
// worker 0 on the transport that reaches peer shims (the fabric), and what
// worker 0 receives for the CM comes back here (each message copied: the
// link's buffer is reused).
bool Daemon::connect_cm_to_peers(std::string& error) {
    TransportPlugin* carrier = nullptr;
    for (auto& t : transports_)
        if (t->cm_capacity()) carrier = t.get();
    if (!carrier) return true;
    if (carrier->cm_capacity() < cm::kMaxCmWire) {
        error = std::string("transport ") + carrier->name() + " carries CM messages of " +
                std::to_string(carrier->cm_capacity()) + " bytes, fewer than rdma_cm's " +
                std::to_string(cm::kMaxCmWire);
        return false;
    }
    cm_.set_outbox([this, carrier](uint16_t peer_first, uint16_t src_lid, const uint8_t* msg, size_t len) {
        Worker* w0 = workers_[0].get();
        std::vector<uint8_t> copy(msg, msg + len);
        w0->post([this, carrier, peer_first, src_lid, copy] {
            if (carrier->send_cm(peer_first, src_lid, copy.data(), copy.size())) return;
            LOG_DEBUG("rdma_cm: a message for the peer of lids %u-: not sent (the peer is down or busy)", peer_first);
            post([this, copy] { cm_.undeliverable(copy.data(), copy.size()); });
        });
    });
    CmCarrierHooks hooks;
    hooks.received = [this](uint16_t first, uint16_t last, uint16_t src_lid, const uint8_t* msg, size_t len) {
        if (posted_cm_.fetch_add(1) >= kMaxPostedCm) {  // the daemon's thread is behind: the peer floods
            posted_cm_.fetch_sub(1);
            if (posted_cm_dropped_.fetch_add(1) % 4096 == 0)
                LOG_WARN("rdma_cm: the peer of lids %u-%u sends faster than this shim handles: messages dropped "
                         "(%llu so far)",
                         first, last, (unsigned long long)posted_cm_dropped_.load());
            return;
        }
        std::vector<uint8_t> copy(msg, msg + len);
        post([this, first, last, src_lid, copy] {
            posted_cm_.fetch_sub(1);
            cm_.from_peer(first, last, src_lid, copy.data(), copy.size());
        });
    };
    hooks.peer = [this](uint16_t first, uint16_t last, bool up) {
        post([this, first, last, up] { up ? cm_.peer_up(first, last) : cm_.peer_down(first, last); });
    };
    carrier->set_cm_hooks(std::move(hooks));
    return true;
}

uint16_t Daemon::free_lid() const {
    // A shim in a fabric owns the LIDs its peers route to it; alone, any
    // unicast LID from --lid-base on will do.
    bool fabric = false;
    for (auto& t : transports_) fabric |= t->reaches_peer_shims();
    const uint32_t last = fabric || opts_.lid_count
                              ? opts_.lid_base + (opts_.lid_count ? opts_.lid_count : uint32_t(lids_.size())) - 1
                              : RouteTable::kMaxLid;
    for (uint32_t lid = opts_.lid_base; lid <= last && lid <= RouteTable::kMaxLid; ++lid)
        if (std::find(lids_.begin(), lids_.end(), uint16_t(lid)) == lids_.end()) return uint16_t(lid);
    return 0;
}

std::string Daemon::add_guest(const std::string& spec, std::string& error) {
    const std::string name = spec.substr(0, spec.find(':'));
    std::string unused;
    if (guest_index(name, unused) >= 0) {
        error = "guest '" + name + "' exists already";
        return "";
    }
    Options one;  // parsed alone, then appended: the options keep removed guests' places
    if (!parse_guest_arg(spec, one, error)) return "";
    if (one.worker_of[0] >= 0 && uint32_t(one.worker_of[0]) >= workers_.size()) {
        error = "worker=" + std::to_string(one.worker_of[0]) + ": the shim has " + std::to_string(workers_.size()) +
                " worker(s)";
        return "";
    }
    if (guest_paths(run_dir_.path(), name).socket.size() >= 108) {
        error = "the run directory is too long for the socket path of guest '" + name + "'";
        return "";
    }
    for (size_t k = 0; k < opts_.addresses.size(); ++k)
        for (const cm::IpAddress& a : one.addresses[0])
            if (lids_[k] && std::find(opts_.addresses[k].begin(), opts_.addresses[k].end(), a) !=
                                opts_.addresses[k].end()) {
                error = "ip " + a.str() + " is guest " + opts_.guests[k] + "'s already";
                return "";
            }
    const uint16_t lid = free_lid();
    if (!lid) {
        error = "no free LID in this shim's range " + std::to_string(opts_.lid_base) + "-" +
                std::to_string(opts_.lid_base + opts_.lid_count - 1) + " (vrdma-shim --lid-count)";
        return "";
    }
    // The worker asked for, else the one with the fewest guests.
    uint32_t w = 0;
    if (one.worker_of[0] >= 0) {
        w = uint32_t(one.worker_of[0]);
    } else {
        std::vector<size_t> count(workers_.size(), 0);
        for (size_t i = 0; i < worker_of_.size(); ++i)
            if (lids_[i]) ++count[worker_of_[i]];
        w = uint32_t(std::min_element(count.begin(), count.end()) - count.begin());
    }
    const size_t i = opts_.guests.size();
    opts_.guests.push_back(name);
    opts_.access.push_back(one.access[0]);
    opts_.controlled_qkeys.push_back(one.controlled_qkeys[0]);
    opts_.pkeys.push_back(one.pkeys[0]);
    opts_.worker_of.push_back(int(w));
    opts_.weights.push_back(one.weights[0]);
    opts_.addresses.push_back(one.addresses[0]);
    worker_of_.push_back(w);
    lids_.push_back(lid);
    Worker& worker = *workers_[w];
    auto added = std::make_shared<const GuestIdentity*>(nullptr);
    const GuestSettings settings = guest_settings(opts_, i);
    const uint64_t guid = derive_guid(host_id(), name);
    if (!call_worker(
            worker, [&worker, i, lid, guid, settings, added] {
                *added = &worker.add_guest(i, lid, guid, settings);
                return std::string();
            },
            error) ||
        !*added) {
        forget_guest(i);
        return "";
    }
    for (auto& other : workers_)
        if (other.get() != &worker) {
            Worker* o = other.get();
            call_worker(*o, [o, lid, w] { o->route_to(lid, w); return std::string(); }, error);
        }
    if (!publish_guest(i, **added, error)) {
        std::string ignored;
        remove_guest(name, ignored);
        return "";
    }
    LOG_INFO("guest %s: added at run time: lid %u guid %s worker %u (%s)", name.c_str(), lid,
             format_guid(guid).c_str(), w, opts_.access[i].describe().c_str());
    return "guest " + name + " lid " + std::to_string(lid) + " worker " + std::to_string(w) + "\n";
}

void Daemon::forget_guest(size_t i) {
    if (i < listeners_.size() && listeners_[i]) {
        epoll_del(listeners_[i].get());
        listeners_[i].reset();
    }
    if (i < cm_listeners_.size() && cm_listeners_[i]) {
        epoll_del(cm_listeners_[i].get());
        cm_listeners_[i].reset();
    }
    if (i < vm_listeners_.size() && vm_listeners_[i]) {
        epoll_del(vm_listeners_[i].get());
        vm_listeners_[i].reset();
    }
    cm_.remove_guest(i);
    opts_.guests[i].clear();
    lids_[i] = 0;
}

bool Daemon::remove_guest(const std::string& name, std::string& error) {
    const int found = guest_index(name, error);
    if (found < 0) return false;
    const size_t i = size_t(found);
    const uint16_t lid = lids_[i];
    // No new connection first; then the guest's worker ends its processes'
    // use of the device, and the others stop routing to it.
    if (listeners_[i]) {
        epoll_del(listeners_[i].get());
        listeners_[i].reset();
    }
    if (i < vm_listeners_.size() && vm_listeners_[i]) {
        epoll_del(vm_listeners_[i].get());
        vm_listeners_[i].reset();
    }
    Worker& worker = *workers_[worker_of_[i]];
    auto closed = std::make_shared<size_t>(0);
    if (!call_worker(worker, [&worker, i, closed] {
            *closed = worker.remove_guest(i);
            return std::string();
        }, error))
        return false;
    for (auto& other : workers_)
        if (other.get() != &worker) {
            Worker* o = other.get();
            std::string ignored;
            call_worker(*o, [o, lid] { o->unroute(lid); return std::string(); }, ignored);
        }
    if (i < published_.size() && published_[i]) published_[i]->unpublish();
    forget_guest(i);
    LOG_INFO("guest %s: removed at run time (lid %u; %zu connection(s) closed)", name.c_str(), lid, *closed);
    return true;
}

bool Daemon::call_worker(Worker& w, std::function<std::string()> task, std::string& error) {
    bool answered = false;
    w.call(std::move(task), kWorkerAnswerMs, answered);
    if (!answered) error = "worker " + std::to_string(w.index()) + " did not answer";
    return answered;
}

bool Daemon::set_port(const std::string& guest, bool up, std::string& error) {
    const int i = guest_index(guest, error);
    if (i < 0) return false;
    if (size_t(i) < published_.size() && !published_[i]->set_port_state(up, error)) return false;
    Worker& w = *workers_[worker_of_[i]];
    return call_worker(
        w, [&w, guest, up] { return std::string(w.engine().set_port_active(guest, up) ? "" : "?"); }, error);
}

bool Daemon::set_weight(const std::string& guest, const std::string& text, std::string& error) {
    uint32_t weight;
    if (!parse_weight(text, weight)) {
        error = "weight must be 1 to " + std::to_string(kMaxGuestWeight) + ", not '" + text + "'";
        return false;
    }
    const int i = guest_index(guest, error);
    if (i < 0) return false;
    Worker& w = *workers_[worker_of_[i]];
    const size_t index = size_t(i);
    // By value: a worker that answers late runs it after this returned.
    auto task = [&w, index, weight] {
        w.engine().guests().set_weight(w.guest(index), weight);
        return std::string();
    };
    if (!call_worker(w, task, error)) return false;
    LOG_INFO("guest %s: weight %u", guest.c_str(), weight);
    return true;
}

void Daemon::shutdown() {
    if (shut_down_) return;
    shut_down_ = true;
    if (started_) sd_notify("STOPPING=1\nSTATUS=stopping");
    // Each worker marks its guests' contexts fatal and closes their
    // connections in its own thread; then, with every thread stopped, the
    // links go (they hold other workers' pins), then the workers.
    for (auto& w : workers_) w->stop();
    for (auto& w : workers_) w->join();
    for (auto& w : workers_) w->drop_links();
    for (auto& t : transports_) t->close();  // what refers to the engines, before they go
    workers_.clear();
    for (auto& [id, c] : metrics_conns_) epoll_del(c.fd.get());
    metrics_conns_.clear();
    if (metrics_) epoll_del(metrics_.get());
    metrics_.reset();
    for (auto& [id, fd] : control_conns_) epoll_del(fd.get());
    control_conns_.clear();
    if (control_) {
        epoll_del(control_.get());
        control_.reset();
        if (run_dir_.fd() >= 0) ::unlinkat(run_dir_.fd(), kControlSocketName, 0);
    }
    listeners_.clear();
    vm_listeners_.clear();
    published_.clear();  // unpublishes each guest
    run_dir_.release();
}

}  // namespace vrdma::shim
