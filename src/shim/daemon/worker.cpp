#include "worker.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>

#include "epoll_set.h"
#include "guest_fd.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {

Worker::Worker(uint32_t index, const Options& opts, SharedTables& shared)
    : index_(index), opts_(opts), engine_(opts.quotas, &shared) {}

Worker::~Worker() {
    stop();
    join();
    drop_links();
}

bool Worker::init(std::string& error) {
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    inbox_.wake.fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!epoll_ || !inbox_.wake.fd || !epoll_add(inbox_.wake.fd.get(), EPOLLIN, tag(kWake, 0))) {
        error = std::string("worker ") + std::to_string(index_) + ": epoll/eventfd: " + strerror(errno);
        return false;
    }
    return true;
}

bool Worker::epoll_add(int fd, uint32_t events, uint64_t data) { return epoll_watch(epoll_.get(), fd, events, data); }

void Worker::epoll_del(int fd) { epoll_unwatch(epoll_.get(), fd); }

const GuestIdentity& Worker::add_guest(size_t guest_index, uint16_t lid, uint64_t guid, const GuestSettings& s) {
    const GuestIdentity& id = engine_.add_guest(s.name, lid, guid, s.controlled_qkeys);
    if (!s.pkeys.empty()) engine_.guests().set_pkeys(id, s.pkeys);
    engine_.guests().set_weight(id, s.weight);
    guests_[guest_index] = &id;
    access_[guest_index] = s.access;
    if (s.vm_memory) vms_[guest_index] = std::make_unique<VmPort>(engine_, id, s.vm_memory);
    for (TransportPlugin* t : transports_) t->guest_added(*this, id);
    return id;
}

size_t Worker::remove_guest(size_t guest_index) {
    auto g = guests_.find(guest_index);
    if (g == guests_.end()) return 0;
    const GuestIdentity* id = g->second;
    engine_.remove_guest(*id);
    std::vector<uint64_t> gone;
    for (auto& [cid, c] : conns_)
        if (c.guest == id) gone.push_back(cid);
    for (uint64_t cid : gone) close_connection(cid);
    drop_vm(guest_index, "the guest was removed");
    vms_.erase(guest_index);
    guests_.erase(g);
    access_.erase(guest_index);
    return gone.size();
}

WorkerLink& Worker::link_to(uint32_t peer, uint32_t workers, WorkerInbox& peer_inbox) {
    if (links_.size() < workers) {
        links_.resize(workers);
        link_ptrs_.resize(workers, nullptr);
    }
    links_[peer] = std::make_unique<WorkerLink>(engine_, index_, peer, peer_inbox);
    link_ptrs_[peer] = links_[peer].get();
    // The device this host's traffic goes through (--hca-local), if any.
    if (const uint8_t* gid = engine_.local_transport().device_gid()) links_[peer]->set_device_gid(gid);
    return *links_[peer];
}

void Worker::route_to(uint16_t lid, uint32_t peer) { engine_.routes().add(lid, lid, links_[peer].get()); }

bool Worker::add_poll_group(PollGroup& group, bool first, std::string& error) {
    const std::vector<int> fds = group.fds();
    for (size_t i = 0; i < fds.size(); ++i)
        if (!epoll_add(fds[i], EPOLLIN, tag(kGroup, (group_ids_.size() << 8) | i))) {
            error = std::string("epoll: ") + strerror(errno);
            return false;
        }
    group_ids_.push_back(&group);
    groups_.insert(first ? groups_.begin() : groups_.end(), &group);
    return true;
}

bool Worker::start(std::string& error) {
    thread_ = std::thread([this] { run(); });
    if (index_ >= opts_.worker_cpus.size()) return true;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(opts_.worker_cpus[index_], &set);
    if (int err = pthread_setaffinity_np(thread_.native_handle(), sizeof(set), &set)) {
        error = "worker " + std::to_string(index_) + ": cannot pin it to CPU " +
                std::to_string(opts_.worker_cpus[index_]) + ": " + strerror(err);
        return false;
    }
    return true;
}

void Worker::stop() {
    stop_.store(true, std::memory_order_seq_cst);
    const uint64_t one = 1;
    if (inbox_.wake.fd) (void)::write(inbox_.wake.fd.get(), &one, sizeof(one));
}

void Worker::join() {
    if (thread_.joinable()) thread_.join();
}

void Worker::drop_links() {
    for (auto& l : links_)
        if (l) engine_.routes().remove(l.get());
    links_.clear();
    link_ptrs_.clear();
    // Messages still in the inbox hold pins of other workers' guests.
    while (WorkerMsg* m = inbox_.ring.front()) {
        m->pins.clear();
        inbox_.ring.pop();
    }
}

void Worker::post(std::function<void()> task) {
    {
        std::lock_guard<std::mutex> lock(tasks_mutex_);
        tasks_.push_back(std::move(task));
    }
    has_tasks_.store(true, std::memory_order_seq_cst);
    inbox_.wake.kick();
}

std::string Worker::call(std::function<std::string()> f, int timeout_ms, bool& answered) {
    auto result = std::make_shared<std::promise<std::string>>();
    std::future<std::string> done = result->get_future();
    post([result, f = std::move(f)] { result->set_value(f()); });
    answered = done.wait_for(std::chrono::milliseconds(timeout_ms)) == std::future_status::ready;
    return answered ? done.get() : std::string();
}

void Worker::run_tasks() {
    if (!has_tasks_.load(std::memory_order_relaxed)) return;
    std::vector<std::function<void()>> tasks;
    {
        std::lock_guard<std::mutex> lock(tasks_mutex_);
        tasks.swap(tasks_);
        has_tasks_.store(false, std::memory_order_relaxed);
    }
    for (auto& t : tasks) t();
}

bool Worker::poll_links() {
    if (links_.empty()) return false;
    bool progress = false;
    for (auto& l : links_)
        if (l) progress |= l->flush();
    progress |= receive_messages(inbox_, link_ptrs_.data(), uint32_t(link_ptrs_.size()), TurnScheduler::kTurnBudget);
    return progress;
}

bool Worker::links_idle() const {
    for (auto& l : links_)
        if (l && !l->idle()) return false;
    return inbox_.ring.empty();
}

// One pass: the contexts, what the other workers sent, and each poll group
// (the fabric, the device) in the order they were added.
bool Worker::pass() {
    bool progress = engine_.poll_once();
    progress |= poll_links();
    for (PollGroup* g : groups_) progress |= g->poll(engine_);
    return progress;
}

void Worker::run() {
    // When the worker last found nothing to do after finding work: 0 while
    // it is busy, so that a busy pass reads no clock of its own.
    uint64_t idle_since = 0;
    unsigned busy_passes = 0, idle_passes = 0;
    bool syscalls = false;  // every pass already makes some
    for (PollGroup* g : groups_) syscalls |= g->polls_with_syscalls();
    // A pinned worker's CPU may be shared with guests pinned beside it,
    // which the host-wide count does not show: it always yields.
    const bool census = !opts_.idle_yield_always && index_ >= opts_.worker_cpus.size();
    while (!stop_.load(std::memory_order_relaxed)) {
        run_tasks();
        bool progress = pass();
        reap_dead_contexts();
        if (progress) {
            idle_since = 0;
            // Kicks of dormant contexts (engine.h) come through the epoll
            // too: looked at more often while there are any.
            if (++busy_passes % (engine_.dormant_count() ? 8 : 64) == 0) poll_events(0);
            continue;
        }
        uint64_t t = monotonic_ns();
        if (!idle_since) idle_since = t;
        if (t - idle_since < kIdleSpinNs) {
            // Where every runnable thread has a core, the yield would give
            // this one to nobody: the pass goes round without it
            // (core_census.h).
            const bool spare = census && census_.cores_to_spare(t);
            // With a fabric, every pass already reads its links (a syscall);
            // the epoll of the rest (connections, control, fabric accepts)
            // is looked at every 8th pass, and so it is where nothing
            // yields: those passes make no system call.
            if ((!syscalls && !spare) || ++idle_passes % 8 == 0) poll_events(0);
            if (!spare) sched_yield();
            continue;
        }
        // Going to sleep: announce it, then look at every ring once more so
        // that a doorbell rung, a message sent or a task posted before the
        // announcement is not missed (WorkerWake::kick reads `asleep` after
        // its own store).
        engine_.set_sleeping(true);
        inbox_.wake.asleep.store(true, std::memory_order_seq_cst);
        for (PollGroup* g : groups_) g->arm();  // a device completion from now on makes its fd readable
        const bool more = pass() || has_tasks_.load(std::memory_order_seq_cst) || !links_idle();
        if (more) {
            inbox_.wake.asleep.store(false, std::memory_order_relaxed);
            engine_.set_sleeping(false);
            idle_since = 0;
            continue;
        }
        int timeout_ms = -1;
        uint64_t dl = engine_.next_deadline_ns();
        for (PollGroup* g : groups_)
            if (uint64_t gdl = g->next_deadline_ns(); gdl && (!dl || gdl < dl)) dl = gdl;
        if (dl) {
            t = monotonic_ns();
            if (dl <= t + 1'000'000) {  // too close to sleep on a millisecond timer
                inbox_.wake.asleep.store(false, std::memory_order_relaxed);
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
        inbox_.wake.asleep.store(false, std::memory_order_relaxed);
        engine_.set_sleeping(false);
        idle_since = 0;
    }
    shutdown();
}

void Worker::poll_events(int timeout_ms) {
    epoll_dispatch(epoll_.get(), timeout_ms, [this](uint64_t kind, uint64_t id, uint32_t events) {
        switch (kind) {
        case kWake: {
            uint64_t v;
            (void)::read(inbox_.wake.fd.get(), &v, sizeof(v));  // the loop looks at tasks and links
            break;
        }
        case kConn:
            on_connection(id, events);
            break;
        case kVm:
            on_vm(size_t(id >> 1), id & 1, events);
            break;
        case kGroup:
            if ((id >> 8) < group_ids_.size()) group_ids_[id >> 8]->on_event(engine_, id & 0xff);
            break;
        case kKick: {
            auto it = conns_.find(id);
            if (it == conns_.end()) break;
            Context* ctx = engine_.find_context(it->second.ctx_id);
            uint64_t v;
            if (!ctx) break;
            ssize_t r = guest_fd_read(ctx->kick_fd(), &v, sizeof(v));
            ctx->check_blocked(r, "kick eventfd");  // EINTR: reaped as dead below
            engine_.wake(*ctx);  // a dormant context rang its doorbell
            if (r < 0 && errno != EAGAIN && errno != EINTR) close_connection(id);
            break;
        }
        }
    });
}

void Worker::adopt_connection(size_t guest_index, uint64_t id, UniqueFd fd) {
    auto g = guests_.find(guest_index);
    if (g == guests_.end()) return;  // not a guest of this worker (cannot happen): closed
    close_stale_connections();
    Connection& c = conns_[id];
    c.id = id;
    c.accepted_ns = monotonic_ns();
    c.guest = g->second;
    c.sock = std::move(fd);
    read_peer_credentials(c);
    const GuestAccess& access = access_[guest_index];
    if (!access.allows(c.uid, c.gid)) {  // before anything is charged
        refuse_connection(c, access, engine_.guests().security_of(*c.guest));
        conns_.erase(id);
        return;
    }
    c.charges.bind(engine_.guests().usage_of(*c.guest));
    if (!c.charges.take(Res::Connections, 1, "a connection") || !c.charges.take(Res::Fds, 1, "a connection")) {
        conns_.erase(id);  // closes it: the guest sees EOF
        return;
    }
    if (!epoll_add(c.sock.get(), EPOLLIN | EPOLLRDHUP, tag(kConn, id))) {
        LOG_WARN("epoll: %s", strerror(errno));
        conns_.erase(id);
    }
}

void Worker::adopt_vm(size_t guest_index, UniqueFd fd) {
    auto v = vms_.find(guest_index);
    if (v == vms_.end()) return;  // removed meanwhile: closed
    Connection c;  // for its peer's credentials and the refusal's counts
    c.guest = guests_.at(guest_index);
    c.sock = std::move(fd);
    read_peer_credentials(c);
    const GuestAccess& access = access_[guest_index];
    if (!access.allows(c.uid, c.gid)) {
        refuse_connection(c, access, engine_.guests().security_of(*c.guest));
        return;
    }
    VmPort& vm = *v->second;
    if (!vm.adopt(std::move(c.sock), c.pid)) return;
    if (!epoll_add(vm.socket_fd(), EPOLLRDHUP, tag(kVm, guest_index << 1)) ||
        !epoll_add(vm.kick_fd(), EPOLLIN, tag(kVm, (guest_index << 1) | 1))) {
        LOG_WARN("epoll: %s", strerror(errno));
        drop_vm(guest_index, "the shim could not watch it");
    }
}

void Worker::on_vm(size_t guest_index, bool bell, uint32_t events) {
    auto v = vms_.find(guest_index);
    if (v == vms_.end() || !v->second->connected()) return;
    if (bell) {
        v->second->on_kick();
        return;
    }
    // QEMU never writes to the socket: anything but its closing is a
    // protocol error, which ends the VM's device too.
    drop_vm(guest_index, events & (EPOLLRDHUP | EPOLLHUP) ? "its socket closed" : "it wrote to its socket");
}

void Worker::drop_vm(size_t guest_index, const char* why) {
    auto v = vms_.find(guest_index);
    if (v == vms_.end() || !v->second->connected()) return;
    epoll_del(v->second->socket_fd());
    epoll_del(v->second->kick_fd());
    v->second->disconnect(why);
}

void Worker::on_connection(uint64_t conn_id, uint32_t events) {
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
void Worker::close_stale_connections() {
    const uint64_t now = monotonic_ns();
    const uint64_t limit = uint64_t(opts_.attach_timeout_s) * 1'000'000'000ull;
    std::vector<uint64_t> stale;
    for (auto& [id, c] : conns_)
        if (!c.ctx_id && now - c.accepted_ns > limit) stale.push_back(id);
    if (stale.empty()) return;
    LOG_WARN("closing %zu connection(s) that did not attach within %u s", stale.size(), opts_.attach_timeout_s);
    for (uint64_t id : stale) close_connection(id);
}

void Worker::close_connection(uint64_t conn_id) {
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

void Worker::reap_dead_contexts() {
    if (!engine_.any_dead()) return;
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

// At stop, in the worker's thread: every context's guest sees the device
// fatal, every connection closes (their QPs' peers on other workers are
// told through the links, which outlive this).
void Worker::shutdown() {
    engine_.mark_all_fatal();
    for (auto& [i, vm] : vms_) drop_vm(i, "the shim stops");
    while (!conns_.empty()) close_connection(conns_.begin()->first);
    run_tasks();  // a task posted meanwhile (its caller waits for its answer)
}

}  // namespace vrdma::shim
