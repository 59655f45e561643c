#include "engine.h"
#include "sliced_transfer.h"

#include <algorithm>
#include <unordered_set>

#include <infiniband/verbs.h>

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

Engine::Engine(Quotas quotas, SharedTables* shared)
    : quotas_(quotas),
      own_shared_(shared ? nullptr : std::make_unique<SharedTables>()),
      shared_(shared ? shared : own_shared_.get()),
      guests_(quotas_, shared_->global_usage()),
      qpns_(*shared_) {
    install_fault_guard();  // guest files behind MRs may be truncated under the shim
}

Engine::~Engine() {
    while (!contexts_.empty()) detach(contexts_.begin()->first);
}

const GuestIdentity& Engine::add_guest(const std::string& name, uint16_t lid, uint64_t guid,
                                       bool controlled_qkeys) {
    const GuestIdentity& g = guests_.add(name, lid, guid, controlled_qkeys);
    routes_.add(lid, lid, &local_);
    return g;
}

Context* Engine::attach(const GuestIdentity& guest, UniqueFd arena, uint64_t gva, uint64_t len, UniqueFd kick,
                        UniqueFd cmd_done, UniqueFd async, int& err, std::string* why, uint64_t arena_offset) {
    err = 0;
    if (len < abi::kControlBlockBytes) {
        err = EINVAL;
        if (why) *why = "arena smaller than the control block";
        return nullptr;
    }
    GuestUsage* usage = guests_.usage_of(guest);
    std::shared_ptr<Mapping> map;
    if ((err = map_segment(std::move(arena), gva, len, arena_offset, map, usage, why, true))) return nullptr;
    const uint64_t id = shared_->new_context_id();
    auto ctx = std::make_unique<Context>(id, guest, quotas_, std::move(map), std::move(kick), std::move(cmd_done),
                                         std::move(async), usage);
    Context* p = ctx.get();
    p->count_deaths_in(&dead_count_);
    contexts_.emplace(id, std::move(ctx));
    dormancy_.add(*p, now());
    return p;
}

void Engine::destroy_resources(Context& ctx) {
    std::unordered_set<uint32_t> gone;
    ctx.qps.for_each([&](uint32_t, Qp& qp) {
        abandon_transfer(*this, qp);
        qpns_.remove(qp.qpn);
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
    QpRef q = qpns_.find(lid, qpn);
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
    dormancy_.remove(ctx);
    if (ctx.dead) --dead_count_;
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

void Engine::rescan_all() {
    for (auto& [id, c] : contexts_) c->request_rescan();
}

void Engine::remove_guest(const GuestIdentity& guest) {
    GuestIdentity* g = guests_.find(guest);
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
    GuestIdentity* g = guests_.find_active(guest);
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

bool Engine::poll_once() {
    bool progress = false;
    const uint64_t pass = turns_.begin_pass();
    const uint64_t t = now();  // one clock read a pass, not one a context
    dormancy_.take_woken([&](uint64_t id) {
        if (Context* c = find_context(id)) dormancy_.wake(*c, t);
    });
    // Only awake contexts: an idle one costs nothing (sweep). Each pass
    // starts one further along, so that no context always comes after
    // another of its guest that spends their common budget. Contexts woken
    // during the pass join the next one.
    const std::vector<Context*>& awake = dormancy_.awake();
    const size_t n = awake.size();
    const size_t first = n ? size_t(pass % n) : 0;
    for (size_t i = 0; i < n; ++i) {
        Context* c = awake[(first + i) % n];
        if (c->dead || !process_context(*c, t)) continue;
        c->last_work_ns = t;
        progress = true;
    }
    progress |= dormancy_.sweep(t, contexts_, [&](Context& c) { return process_context(c, t); });
    return progress;
}

// Finding work: a QP deadline that passed or a shim-side rescan make the
// pass look at every QP, and so does the doorbell counter where it can
// stand for a queue (an SRQ, which has no work bit); otherwise only
// the QPs named by the guest's work bits and those the shim marked are
// looked at, so an idle QP costs nothing. Where the doorbell can only mean
// a command or a CQ being armed, the pass runs the commands, which mark the
// QPs they change, and looks at the CQs holding completions written while
// they were not armed (cq_events.h): a command costs O(1), not O(QPs).
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
    struct TurnEnd {
        Engine& eng;
        ~TurnEnd() { eng.turns_.end_turn(eng.now()); }
    } turn_end{*this};
    // A turn starts where the pass or the turn before it ended (one clock
    // read a turn, not two); the loads that found other contexts idle in
    // between are charged to it.
    turns_.begin_turn(ctx, latest_now());
    GuestLoad& load = ctx.guest().load;
    bool progress = false;
    // Once the turn is spent, the QPs not looked at yet wait for the next
    // pass, first in line then, so that other contexts are served in
    // between and no QP of this one is passed over twice.
    auto serve = [&](Qp& qp) {
        if (turns_.spent()) {
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
        // The doorbell may be an arming that finds a completion waiting.
        if (!ctx.silent_cqs.empty()) cq_check_armings(ctx);
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
        ctx.mark_dead();
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
