#include "engine.h"
#include "sliced_transfer.h"

#include <algorithm>
#include <unordered_set>

#include <infiniband/verbs.h>
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "async_events.h"
#include "commands.h"
#include "cq_events.h"
#include "cq_writer.h"
#include "fault_guard.h"
#include "requester.h"
#include "transport.h"
#include "qp_state.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"
#include "work_queue.h"

namespace vrdma::shim {
namespace {

// The device is gone for the context; the first reason written stays.
void set_shim_state(Context& ctx, uint32_t state) {
    uint32_t running = abi::kShimRunning;
    ctx.control()->shim_state.compare_exchange_strong(running, state, std::memory_order_seq_cst);
}

}  // namespace

namespace {

// The states in which an RC QP is connected to a peer.
bool connected_state(uint32_t state) {
    return state == IBV_QPS_RTR || state == IBV_QPS_RTS || state == IBV_QPS_SQD || state == IBV_QPS_SQE;
}

}  // namespace

uint64_t monotonic_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

Engine::Engine(Quotas quotas, SharedTables* shared)
    : quotas_(quotas),
      own_shared_(shared ? nullptr : std::make_unique<SharedTables>()),
      shared_(shared ? shared : own_shared_.get()) {
    install_fault_guard();  // guest files behind MRs may be truncated under the shim
}

GuestUsage* Engine::usage_of(const GuestIdentity& guest) {
    for (size_t i = 0; i < guests_.size(); ++i)
        if (guests_[i].get() == &guest) return usages_[i].get();
    return nullptr;
}

void Engine::set_pkeys(const GuestIdentity& guest, std::vector<uint16_t> pkeys) {
    for (auto& g : guests_)
        if (g.get() == &guest && !pkeys.empty()) g->pkeys = std::move(pkeys);
}

void Engine::set_weight(const GuestIdentity& guest, uint32_t weight) {
    for (auto& g : guests_)
        if (g.get() == &guest) g->weight = std::clamp(weight, 1u, kMaxGuestWeight);
}

GuestSecurity& Engine::security_of(const GuestIdentity& guest) {
    for (auto& g : guests_)
        if (g.get() == &guest) return g->security;
    thread_local GuestSecurity unknown;  // a guest of no engine (tests): counted nowhere that matters
    return unknown;
}

Engine::~Engine() {
    while (!contexts_.empty()) detach(contexts_.begin()->first);
}

const GuestIdentity& Engine::add_guest(const std::string& name, uint16_t lid, uint64_t guid,
                                       bool controlled_qkeys) {
    auto g = std::make_unique<GuestIdentity>();
    g->controlled_qkeys = controlled_qkeys;
    g->name = name;
    g->lid = lid;
    g->guid = guid;
    usages_.push_back(std::make_unique<GuestUsage>(name, quotas_, shared_->global_usage()));
    routes_.add(lid, lid, &local_);
    guests_.push_back(std::move(g));
    return *guests_.back();
}

Context* Engine::attach(const GuestIdentity& guest, UniqueFd arena, uint64_t gva, uint64_t len, UniqueFd kick,
                        UniqueFd cmd_done, UniqueFd async, int& err, std::string* why) {
    err = 0;
    if (len < abi::kControlBlockBytes) {
        err = EINVAL;
        if (why) *why = "arena smaller than the control block";
        return nullptr;
    }
    GuestUsage* usage = usage_of(guest);
    std::shared_ptr<Mapping> map;
    if ((err = map_segment(std::move(arena), gva, len, 0, map, usage, why, true))) return nullptr;
    const uint64_t id = shared_->new_context_id();
    auto ctx = std::make_unique<Context>(id, guest, quotas_, std::move(map), std::move(kick), std::move(cmd_done),
                                         std::move(async), usage);
    Context* p = ctx.get();
    p->set_wake_list(&wake_ids_);
    p->last_work_ns = now();
    contexts_.emplace(id, std::move(ctx));
    awake_.push_back(p);
    return p;
}

void Engine::destroy_resources(Context& ctx) {
    std::unordered_set<uint32_t> gone;
    ctx.qps.for_each([&](uint32_t, Qp& qp) {
        abandon_transfer(*this, qp);
        unregister_qp(qp.qpn);
        if (qp.type != IBV_QPT_RC) return;
        gone.insert(qp.qpn);
        // A peer on another shim is told through the transport that reaches it.
        Transport* t = routes_.lookup(qp.attr.ah.dlid);
        if (t && t != &local_ && connected_state(qp.state))
            t->qp_gone(ctx.guest().lid, qp.qpn, qp.attr.ah.dlid, qp.attr.dest_qp_num);
    });
    if (!gone.empty()) fail_peers_of(ctx.guest().lid, gone);
}

void Engine::fail_peer_qp(uint16_t gone_lid, uint32_t gone_qpn, uint16_t lid, uint32_t qpn, int event) {
    QpRef q = find_qp(lid, qpn);
    if (!q || q.qp->type != IBV_QPT_RC || q.qp->attr.ah.dlid != gone_lid || q.qp->attr.dest_qp_num != gone_qpn)
        return;
    if (!connected_state(q.qp->state)) return;
    if (event == IBV_EVENT_QP_FATAL)
        LOG_INFO("guest %s: QP %u to error: its peer QP %u (lid %u, another shim or worker) vanished",
                 q.ctx->guest().name.c_str(), qpn, gone_qpn, gone_lid);
    qp_set_error(*q.ctx, *q.qp, event);
}

void Engine::fail_responder_of(Context& ctx, const Qp& qp, uint32_t status) {
    const int event = status == IBV_WC_REM_ACCESS_ERR    ? IBV_EVENT_QP_ACCESS_ERR
                      : status == IBV_WC_REM_INV_REQ_ERR ? IBV_EVENT_QP_REQ_ERR
                      : status == IBV_WC_REM_OP_ERR      ? IBV_EVENT_QP_FATAL
                                                         : -1;
    if (event < 0 || qp.type != IBV_QPT_RC) return;
    const uint16_t lid = qp.attr.ah.dlid;
    Transport* t = routes_.lookup(lid);
    if (t == &local_)
        fail_peer_qp(ctx.guest().lid, qp.qpn, lid, qp.attr.dest_qp_num, event);
    else if (t)
        t->qp_gone(ctx.guest().lid, qp.qpn, lid, qp.attr.dest_qp_num, event);
}

// RC QPs of other contexts connected to QPs that vanished go to error now,
// flushing their posted work, rather than waiting for their next send to
// time out: a responder that only waits for receives would wait forever.
void Engine::fail_peers_of(uint16_t lid, const std::unordered_set<uint32_t>& qpns) {
    for (auto& entry : contexts_) {
        Context* c = entry.second.get();  // not a structured binding: clang 14 cannot capture those
        c->qps.for_each([&](uint32_t, Qp& qp) {
            if (qp.type != IBV_QPT_RC || qp.attr.ah.dlid != lid || !qpns.count(qp.attr.dest_qp_num)) return;
            if (!connected_state(qp.state)) return;
            LOG_INFO("guest %s: QP %u to error: its peer QP %u vanished", c->guest().name.c_str(), qp.qpn,
                     qp.attr.dest_qp_num);
            qp_set_error(*c, qp, IBV_EVENT_QP_FATAL);
        });
    }
}

void Engine::detach(uint64_t ctx_id) {
    auto it = contexts_.find(ctx_id);
    if (it == contexts_.end()) return;
    Context& ctx = *it->second;
    set_shim_state(ctx, abi::kShimFatal);
    destroy_resources(ctx);
    LOG_INFO("guest %s: context %llu detached (%u QPs, %u MRs freed)", ctx.guest().name.c_str(),
             (unsigned long long)ctx_id, ctx.qps.size(), ctx.mrs.size());
    if (ctx.dormant)
        --dormant_count_;
    else
        std::erase(awake_, &ctx);
    contexts_.erase(it);
}

Context* Engine::find_context(uint64_t ctx_id) {
    auto it = contexts_.find(ctx_id);
    return it == contexts_.end() ? nullptr : it->second.get();
}

std::vector<uint64_t> Engine::dead_contexts() const {
    std::vector<uint64_t> v;
    for (auto& [id, c] : contexts_)
        if (c->dead) v.push_back(id);
    return v;
}

void Engine::register_qp(uint32_t qpn, Context& ctx, uint32_t handle) {
    shared_->take_qpn(qpn);
    qpns_[qpn] = QpLoc{&ctx, handle};
}

void Engine::unregister_qp(uint32_t qpn) {
    if (!qpns_.erase(qpn)) return;
    shared_->multicast().detach_all(qpn);
    shared_->release_qpn(qpn);
}

Engine::QpRef Engine::find_qp_by_qpn(uint32_t qpn) {
    auto it = qpns_.find(qpn);
    if (it == qpns_.end() || it->second.ctx->dead) return {};
    Qp* qp = it->second.ctx->qps.get(it->second.handle);
    if (!qp) return {};
    return QpRef{it->second.ctx, qp, it->second.handle};
}

Engine::QpRef Engine::find_qp(uint16_t lid, uint32_t qpn) {
    QpRef ref = find_qp_by_qpn(qpn);
    return ref && ref.ctx->guest().lid == lid ? ref : QpRef{};
}

const uint8_t* Engine::device_gid() const {
    for (const Transport* t : keepers_)
        if (const uint8_t* g = t->own_device_gid()) return g;
    return nullptr;
}

abi::DeviceAttr Engine::device_attr(const Context& ctx) const {
    abi::DeviceAttr a = make_device_attr(ctx.guest(), ctx.quotas());
    for (const Transport* t : keepers_) t->limit_device(a);
    return a;
}

uint64_t Engine::next_deadline_ns() const {
    uint64_t best = 0;
    for (auto& [id, c] : contexts_)
        if (c->next_deadline_ns && (!best || c->next_deadline_ns < best)) best = c->next_deadline_ns;
    return best;
}

void Engine::set_sleeping(bool sleeping) {
    sleeping_ = sleeping;
    // A dormant context's guest was told the shim sleeps: it stays told.
    for (Context* c : awake_) tell_sleeping(*c, sleeping);
}

void Engine::wake(Context& ctx) {
    ctx.wake_queued = false;
    if (!ctx.dormant) return;
    ctx.dormant = false;
    --dormant_count_;
    ctx.last_work_ns = now();
    tell_sleeping(ctx, sleeping_);
    awake_.push_back(&ctx);
}

// Contexts idle for kDormantAfterNs leave the passes: their guest is told
// the shim sleeps (so its next doorbell kicks the eventfd, which wakes the
// context), then its rings are looked at once more, so that a doorbell rung
// before it was told is not missed (the handshake of protocol.md "Doorbell
// and sleeping", per context). Dormant contexts are also looked at here, in
// case something of the shim's own was missed.
bool Engine::sweep(uint64_t t) {
    bool progress = false;
    for (size_t i = 0; i < awake_.size();) {
        Context& c = *awake_[i];
        // Without a kick eventfd (in-process tests) its guest could never
        // wake it.
        if (c.dead || c.kick_fd() < 0 || c.rescan || c.next_deadline_ns || c.has_marked() ||
            t - c.last_work_ns < kDormantAfterNs) {
            ++i;
            continue;
        }
        tell_sleeping(c, true);
        if (process_context(c, t)) {
            tell_sleeping(c, sleeping_);
            progress = true;
            ++i;
            continue;
        }
        c.dormant = true;
        ++dormant_count_;
        awake_[i] = awake_.back();  // order among contexts does not matter
        awake_.pop_back();
    }
    if (dormant_count_)
        for (auto& [id, c] : contexts_)
            if (c->dormant && !c->dead && process_context(*c, t)) {
                wake(*c);
                progress = true;
            }
    return progress;
}

void Engine::rescan_all() {
    for (auto& [id, c] : contexts_) c->request_rescan();
}

void Engine::remove_guest(const GuestIdentity& guest) {
    GuestIdentity* g = nullptr;
    for (auto& p : guests_)
        if (p.get() == &guest) g = p.get();
    if (!g || g->removed) return;
    for (auto& [id, c] : contexts_)
        if (&c->guest() == g) {
            set_shim_state(*c, abi::kGuestRemoved);
            post_device_fatal(*c);
        }
    g->removed = true;
    g->port_active = false;
    routes_.remove_lid(g->lid);
}

void Engine::mark_all_fatal() {
    for (auto& [id, c] : contexts_) {
        set_shim_state(*c, abi::kShimFatal);
        post_device_fatal(*c);
    }
}

bool Engine::set_port_active(const std::string& guest, bool active) {
    GuestIdentity* g = nullptr;
    for (auto& p : guests_)
        if (p->name == guest && !p->removed) g = p.get();
    if (!g) return false;
    if (g->port_active == active) return true;
    g->port_active = active;
    LOG_INFO("guest %s: port 1 %s", guest.c_str(), active ? "ACTIVE" : "DOWN");
    for (auto& [id, c] : contexts_)
        if (&c->guest() == g) post_port_event(*c, active ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
    return true;
}

std::vector<int> Engine::kick_fds() const {
    std::vector<int> v;
    for (auto& [id, c] : contexts_)
        if (c->kick_fd() >= 0) v.push_back(c->kick_fd());
    return v;
}

bool Engine::turn_spent_timed() {
    if (turn_spent()) return true;
    if (++turn_checks_ % kTurnClockEvery) return false;
    // WQEs are charged by count: the turn's real time counts too.
    turn_used_ = turn_cost(now() - turn_start_ns_);
    return turn_spent();
}

bool Engine::yield_to_others() {
    if (turn_ctx_ && others_have_work()) {
        turn_yielded_ = true;
        turn_budget_ = turn_used_;  // spent: the rest waits for the next pass
        return true;
    }
    yield_check_at_ = turn_used_ + turn_small_;
    return false;
}

// Whether a context of another guest than the turn's has work waiting: a
// doorbell or work bits it wrote, QPs the shim marked, a dormant context
// woken. Reads what the next pass would read, for at most kYieldScan
// contexts a check.
bool Engine::others_have_work() {
    if (!wake_ids_.empty()) return true;
    const size_t n = awake_.size();
    const size_t k = std::min(n, kYieldScan);
    const GuestIdentity* mine = &turn_ctx_->guest();
    for (size_t i = 0; i < k; ++i) {
        Context* c = awake_[(yield_scan_from_ + i) % n];
        if (c->dead || &c->guest() == mine) continue;
        if (c->has_marked()) return true;
        const abi::ControlBlock* cb = c->control();
        if (cb->work_summary.load(std::memory_order_relaxed) != 0 ||
            cb->doorbell.load(std::memory_order_relaxed) != c->last_doorbell)
            return true;
    }
    yield_scan_from_ += k;
    return false;
}

bool Engine::poll_once() {
    bool progress = false;
    ++worker_load_.passes;
    const uint64_t t = now();  // one clock read a pass, not one a context
    if (!wake_ids_.empty()) {
        wake_batch_.swap(wake_ids_);
        for (uint64_t id : wake_batch_)
            if (Context* c = find_context(id)) wake(*c);
        wake_batch_.clear();
    }
    // Only awake contexts: an idle one costs nothing (sweep). Each pass
    // starts one further along, so that no context always comes after
    // another of its guest that spends their common budget. Contexts woken
    // during the pass join the next one.
    const size_t n = awake_.size();
    const size_t first = n ? size_t(worker_load_.passes % n) : 0;
    for (size_t i = 0; i < n; ++i) {
        Context* c = awake_[(first + i) % n];
        if (c->dead || !process_context(*c, t)) continue;
        c->last_work_ns = t;
        progress = true;
    }
    if (t >= next_sweep_ns_) {
        next_sweep_ns_ = t + kSweepNs;
        progress |= sweep(t);
    }
    return progress;
}

// Finding work: a QP deadline that passed or a shim-side rescan make the
// pass look at every QP, and so does the doorbell counter where it can
// stand for a queue (an SRQ, which has no work bit); otherwise only
// the QPs named by the guest's work bits and those the shim marked are
// looked at, so an idle QP costs nothing. Where the doorbell can only mean
// a command or a CQ being armed (the shim looks at arming when it writes a
// completion: cq_events.h), the pass runs the commands, which mark the QPs
// they change: a command costs O(1), not O(QPs).
bool Engine::process_context(Context& ctx, uint64_t t) {
    if (ctx.dead) return false;
    abi::ControlBlock* cb = ctx.control();
    const uint32_t db = cb->doorbell.load(std::memory_order_seq_cst);
    // An idle context costs two loads: the summary is taken (a locked
    // read-modify-write) only when it names something. The load is seq_cst
    // like the exchange, so the sleeping handshake (protocol.md) holds.
    uint64_t summary = cb->work_summary.load(std::memory_order_seq_cst);
    if (summary) summary = cb->work_summary.exchange(0, std::memory_order_seq_cst);
    const bool due = ctx.next_deadline_ns && t >= ctx.next_deadline_ns;
    const bool rung = db != ctx.last_doorbell;
    const bool rung_for_queues = rung && ctx.srqs.size();
    const bool full = rung_for_queues || ctx.rescan || due;
    // The words the summary names; a bit names the QPs of the table slots
    // equal to it modulo kWorkSlots (one QP up to 4096 QPs; cmd_qp.cpp); a
    // bit for slots with no QP is ignored.
    const uint32_t slots = ctx.qps.slot_count();
    for (uint64_t words = summary; words; words &= words - 1) {
        const uint32_t w = uint32_t(__builtin_ctzll(words));
        for (uint64_t bits = cb->work_bits[w].exchange(0, std::memory_order_seq_cst); bits; bits &= bits - 1) {
            uint32_t handle;
            for (uint32_t s = w * 64 + uint32_t(__builtin_ctzll(bits)); s < slots; s += abi::kWorkSlots)
                if (Qp* qp = ctx.qps.at_slot(s, handle)) ctx.mark_work(*qp);
        }
    }
    if (!full && !rung && !ctx.has_marked()) return false;
    // The turn's time goes to its guest and to the worker (vrdmactl load).
    // The guest's budget for this pass is shared by its contexts.
    struct TurnClock {
        Engine& eng;
        GuestLoad& load;
        uint64_t start;
        bool in_debt = false;  // the turn began with its budget spent: its time is not charged again
        ~TurnClock() {
            const uint64_t d = eng.now() - start;
            load.busy_ns += d;
            load.pass_used = in_debt ? eng.turn_used_ : eng.turn_cost(d);
            // What the pass's use is measured against: the small budget if
            // the turn gave way to another guest.
            load.pass_budget = eng.turn_yielded_ ? eng.turn_small_ : eng.turn_budget_;
            if (eng.turn_yielded_) ++load.yields;
            eng.worker_load_.busy_ns += d;
            eng.turn_ctx_ = nullptr;
        }
    } turn_clock{*this, ctx.guest().load, now()};
    GuestLoad& load = ctx.guest().load;
    ++load.turns;
    turn_budget_ = kTurnBudget * ctx.guest().weight;
    turn_small_ = kSmallTurn * ctx.guest().weight;
    if (load.pass != worker_load_.passes) {
        // Deficit round robin: what the guest's last turn took beyond its
        // budget (the small one if it gave way; the slice or WQE that
        // crossed it, a turn preempted) comes off the next ones, up to
        // kMaxDebtBudgets full budgets, so that shares follow the weights
        // however coarse a slice is against the budget.
        const uint64_t b = load.pass_budget ? load.pass_budget : turn_budget_;
        load.pass_used =
            load.pass_used > b ? std::min(load.pass_used - b, kMaxDebtBudgets * turn_budget_) : 0;
        load.pass = worker_load_.passes;
    }
    bool progress = false;
    turn_used_ = turn_carried_ = load.pass_used;
    turn_ctx_ = &ctx;
    turn_yielded_ = false;
    yield_check_at_ = turn_small_;
    turn_clock.in_debt = turn_used_ >= turn_budget_;
    turn_start_ns_ = turn_clock.start;
    turn_checks_ = 0;
    // Once the turn is spent, the QPs not looked at yet wait for the next
    // pass, first in line then, so that other contexts are served in
    // between and no QP of this one is passed over twice.
    auto serve = [&](Qp& qp) {
        if (turn_spent()) {
            ctx.mark_skipped(qp);
            progress = true;  // work is left: not an idle pass
        } else {
            progress |= requester_process(*this, ctx, qp, t);
        }
        ++load.qp_visits;
    };
    if (rung) {
        ctx.last_doorbell = db;
        progress = process_commands(ctx);
        if (ctx.dead) return true;
    }
    // Taken after the commands: the QPs they changed are among them.
    std::vector<uint32_t>& marked = ctx.take_marked();
    if (full) {
        ctx.rescan = false;
        ctx.next_deadline_ns = 0;
        // The marked QPs first (those skipped last time lead), then all
        // (a QP served twice just finds less to do).
        for (uint32_t h : marked) {
            Qp* qp = ctx.qps.get(h);
            if (!qp) continue;
            qp->work_marked = false;
            serve(*qp);
            if (ctx.dead) return true;
        }
        ctx.qps.for_each([&](uint32_t, Qp& qp) { serve(qp); });
        return progress;
    }
    for (uint32_t h : marked) {
        Qp* qp = ctx.qps.get(h);
        if (!qp) continue;  // destroyed since it was marked
        qp->work_marked = false;
        serve(*qp);
        if (ctx.dead) return true;
    }
    return progress;
}

bool Engine::process_commands(Context& ctx) {
    abi::ControlBlock* cb = ctx.control();
    uint32_t prod = cb->cmd_producer.load(std::memory_order_acquire);
    if (!ring_valid_producer(prod, ctx.cmd_cons, abi::kCmdSlots)) {
        LOG_WARN("guest %s: context %llu wrote an invalid cmd_producer %u (consumer %u): detaching it",
                 ctx.guest().name.c_str(), (unsigned long long)ctx.id(), prod, ctx.cmd_cons);
        ctx.dead = true;
        return false;
    }
    uint32_t n = ring_count(prod, ctx.cmd_cons, abi::kCmdSlots);
    if (n == 0) return false;
    alignas(8) uint8_t req[abi::kCmdReqBytes];
    alignas(8) uint8_t resp[abi::kCmdRespBytes];
    for (uint32_t i = 0; i < n; ++i) {
        abi::CmdSlot& slot = cb->cmd[ring_slot(ctx.cmd_cons, abi::kCmdSlots)];
        uint32_t seq = slot.seq.load(std::memory_order_acquire);
        uint32_t op;
        std::memcpy(&op, &slot.op, sizeof(op));
        std::memcpy(req, slot.req, sizeof(req));
        std::memset(resp, 0, sizeof(resp));
        int status = dispatch_command(*this, ctx, op, req, resp);
        if (status) LOG_DEBUG("guest %s: command %s failed: %s", ctx.guest().name.c_str(), command_name(op), strerror(status));
        std::memcpy(slot.resp, resp, sizeof(resp));
        slot.status = status;
        slot.done_seq.store(seq, std::memory_order_release);
        ctx.cmd_cons = ring_next(ctx.cmd_cons, abi::kCmdSlots);
        cb->cmd_consumer.store(ctx.cmd_cons, std::memory_order_release);
    }
    ctx.signal_cmd_done();
    return true;
}

}  // namespace vrdma::shim
