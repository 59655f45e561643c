#include "requester.h"
#include "sliced_transfer.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstring>

#include "async_events.h"
#include "cq_writer.h"
#include "engine.h"
#include "transport.h"
#include "memory_windows.h"
#include "multicast_delivery.h"
#include "psn.h"
#include "qp_state.h"
#include "tag_matching.h"
#include "responder.h"
#include "transport.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

bool is_rdma_read_or_atomic(uint32_t op) {
    return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}
bool is_atomic(uint32_t op) { return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD; }
// Operations on the shim's own tables (memory windows), not on the peer.
bool is_local_op(uint32_t op) { return op == IBV_WR_BIND_MW || op == IBV_WR_LOCAL_INV; }

// The oldest request in flight times out one timeout after ack_since_ns
// (nothing in flight: no timer).
void arm_ack_timer(Qp& qp) {
    const bool in_flight = qp.req.sq_next != qp.sq.cons;
    qp.req.ack_deadline_ns = in_flight ? qp.req.ack_since_ns + ack_timeout_ns(qp.attr.timeout) : 0;
}

uint32_t inflight_count(const Qp& qp) { return ring_count(qp.req.sq_next, qp.sq.cons, qp.sq.entries); }

// Resends everything in flight, from the oldest WQE.
void rewind(Qp& qp) {
    qp.req.sq_next = qp.sq.cons;
    qp.req.next_psn = qp.req.una_psn;
    qp.req.ack_deadline_ns = 0;
    qp.req.rewound = true;
}

// The engine's pins, emptied, when transport `t` moves the payload after
// send() returns (it must keep the mappings alive); null when it copies at
// once.
Pins* fresh_pins(Engine& eng, Transport* t) {
    if (!t || !t->keeps_memory()) return nullptr;
    Pins& p = eng.scratch_pins();
    p.clear();
    return &p;
}

// The sender's memory of a WQE: inline data, or its SGEs resolved with the
// access the operation needs (the shim writes READ data and atomic results).
uint32_t resolve_local(const Context& ctx, const Qp& qp, SendWork& w, Span* loc, uint32_t& nl, uint64_t& len,
                       Pins* pins = nullptr) {
    if (w.is_inline) {
        loc[0] = Span{w.inline_data, w.inline_len};
        nl = w.inline_len ? 1 : 0;
        len = w.inline_len;
        return IBV_WC_SUCCESS;
    }
    uint32_t need = is_rdma_read_or_atomic(w.hdr.opcode) ? IBV_ACCESS_LOCAL_WRITE : 0;
    return resolve_sges(ctx, qp.pd, w.sge, w.num_sge, need, loc, nl, len, pins);
}

// Pushes the completion of the WQE at the head of the send queue after
// moving the consumer index past it (a provider that sees the completion
// may reuse the slot at once). `w` is the WQE when the caller has it.
void complete_head(Engine& eng, Context& ctx, Qp& qp, uint32_t status, const SendWork* w, uint64_t len) {
    abi::SendWqe hdr;
    if (w) {
        hdr = w->hdr;
    } else {
        std::memcpy(&hdr, qp.sq.slot(qp.sq.cons), sizeof(hdr));
        // The length, for a completion that will be written only (most
        // sends of a stream are unsignaled: reading the WQE again and
        // resolving its SGEs for nothing was a tenth of a 64-byte write's
        // cost at the requester).
        const bool signaled = qp.sig_all || (hdr.send_flags & IBV_SEND_SIGNALED);
        if (status == IBV_WC_SUCCESS && signaled) {
            SendWork& s = eng.scratch();
            read_send_wqe(qp.sq, qp.sq.cons, qp.max_send_sge, qp.max_inline, s);
            Span loc[abi::kMaxSge];
            uint32_t nl = 0;
            if (resolve_local(ctx, qp, s, loc, nl, len) != IBV_WC_SUCCESS) len = 0;
        }
    }
    const bool in_flight = qp.req.sq_next != qp.sq.cons;
    wq_consume(qp.sq);
    if (!in_flight) qp.req.sq_next = qp.sq.cons;
    if (!is_local_op(hdr.opcode)) {  // a local operation sends nothing: it takes no PSN
        qp.req.una_psn = psn_next(qp.req.una_psn);
        qp.req.rewound = false;
        // UD and UC: what is still in flight (sent later by the fabric,
        // requester_sent) keeps the PSNs it took.
        if (qp.type != IBV_QPT_RC && qp.req.sq_next == qp.sq.cons) qp.req.next_psn = qp.req.una_psn;
    }
    bool signaled = qp.sig_all || (hdr.send_flags & IBV_SEND_SIGNALED);
    if (status == IBV_WC_SUCCESS && !signaled) return;
    abi::Cqe c{};
    c.wr_id = hdr.wr_id;
    c.status = status;
    c.opcode = wc_opcode_for(hdr.opcode);
    c.byte_len = status == IBV_WC_SUCCESS ? uint32_t(len) : 0;
    c.qp_num = qp.qpn;
    cq_push(ctx, qp.send_cq, c);
}

// The head WQE fails with `status`: RC QPs go to error (the rest is
// flushed), UD and UC QPs to SQE.
void fail_head(Engine& eng, Context& ctx, Qp& qp, uint32_t status, const SendWork* w) {
    complete_head(eng, ctx, qp, status, w, 0);
    rewind(qp);
    if (qp.type != IBV_QPT_RC)
        qp_set_sq_error(ctx, qp);
    else
        qp_set_error(ctx, qp, -1);
}

// A request was lost (dropped by the responder, or its response timed
// out): wait the QP's timeout, then send it again, retry_cnt times.
void lost(Engine& eng, Context& ctx, Qp& qp) {
    rewind(qp);
    qp.req.wait = SqWait::Retry;
    qp.req.deadline_ns = eng.now() + ack_timeout_ns(qp.attr.timeout);
    ctx.note_deadline(qp.req.deadline_ns);
}

// The head was acknowledged and completed: the retry budgets refill, and
// progress restarts the timer of what is still in flight (with nothing in
// flight, a synchronous transport or the last ACK, there is no timer and no
// clock to read).
void head_acked(Engine& eng, Qp& qp) {
    qp.req.wait = SqWait::None;
    qp.req.retries_left = qp.attr.retry_cnt;
    qp.req.rnr_left = qp.attr.rnr_retry;
    if (qp.req.sq_next != qp.sq.cons) qp.req.ack_since_ns = eng.now();
    arm_ack_timer(qp);
}

// Handles the response to the request at the head of the queue. `w` and
// `loc` are the WQE and its memory when the caller has them (a synchronous
// transport); otherwise they are read again from the ring.
void on_head_response(Engine& eng, Context& ctx, Qp& qp, const Response& r, const SendWork* w, const Span* loc,
                      uint32_t nl, uint64_t len) {
    switch (r.syndrome) {
    case Syndrome::Ack: {
        if (w ? is_atomic(w->hdr.opcode) : false) {
            Span o{reinterpret_cast<uint8_t*>(const_cast<uint64_t*>(&r.atomic_orig)), 8};
            if (copy_sg(loc, nl, 0, &o, 1, 8) != CopyFault::None)
                return fail_head(eng, ctx, qp, IBV_WC_LOC_PROT_ERR, w);
        } else if (!w) {
            abi::SendWqe hdr;
            std::memcpy(&hdr, qp.sq.slot(qp.sq.cons), sizeof(hdr));
            if (is_atomic(hdr.opcode)) {
                SendWork& s = eng.scratch();
                Span l[abi::kMaxSge];
                uint32_t n = 0;
                uint64_t total = 0;
                uint32_t st = read_send_wqe(qp.sq, qp.sq.cons, qp.max_send_sge, qp.max_inline, s);
                if (st == IBV_WC_SUCCESS) st = resolve_local(ctx, qp, s, l, n, total);
                if (st != IBV_WC_SUCCESS || total != 8) return fail_head(eng, ctx, qp, IBV_WC_LOC_PROT_ERR, nullptr);
                Span o{reinterpret_cast<uint8_t*>(const_cast<uint64_t*>(&r.atomic_orig)), 8};
                if (copy_sg(l, n, 0, &o, 1, 8) != CopyFault::None)
                    return fail_head(eng, ctx, qp, IBV_WC_LOC_PROT_ERR, nullptr);
            }
        }
        complete_head(eng, ctx, qp, IBV_WC_SUCCESS, w, len);
        return head_acked(eng, qp);
    }
    case Syndrome::RnrNak:
        if (qp.attr.rnr_retry != 7) {
            if (qp.req.rnr_left == 0) return fail_head(eng, ctx, qp, IBV_WC_RNR_RETRY_EXC_ERR, w);
            --qp.req.rnr_left;
        }
        rewind(qp);
        qp.req.wait = SqWait::Rnr;
        qp.req.deadline_ns = eng.now() + rnr_timer_ns(r.rnr_timer);
        ctx.note_deadline(qp.req.deadline_ns);
        return;
    case Syndrome::NakSeq:
        if (qp.req.retries_left == 0) return fail_head(eng, ctx, qp, IBV_WC_RETRY_EXC_ERR, w);
        --qp.req.retries_left;
        rewind(qp);
        return;
    case Syndrome::NakInvReq:
        return fail_head(eng, ctx, qp, IBV_WC_REM_INV_REQ_ERR, w);
    case Syndrome::NakAccess:
        return fail_head(eng, ctx, qp, IBV_WC_REM_ACCESS_ERR, w);
    case Syndrome::NakOp:
        return fail_head(eng, ctx, qp, IBV_WC_REM_OP_ERR, w);
    case Syndrome::Drop:
        return lost(eng, ctx, qp);
    case Syndrome::LocalFault:
        return fail_head(eng, ctx, qp, IBV_WC_LOC_PROT_ERR, w);
    }
}

// What names the sender in every request: its (LID, QPN), its P_Key, and
// for a connection the incarnations it joins (responder.cpp checks them).
void stamp_source(const Context& ctx, const Qp& qp, Request& req) {
    const auto& keys = ctx.guest().pkeys;
    req.slid = ctx.guest().lid;
    req.sqpn = qp.qpn;
    req.pkey = qp.attr.pkey_index < keys.size() ? keys[qp.attr.pkey_index] : 0;  // 0: no partition
    req.src_incarnation = qp.incarnation;
    req.dst_incarnation = qp.peer_incarnation;
}

// A message the transport took (vrdmactl load); a resent one was counted.
void count_issued(const Context& ctx, const Request& req) {
    if (req.resend) return;
    ++ctx.guest().load.messages;
    ctx.guest().load.bytes += req.length;
}

Transport* transport_of(Engine& eng, Qp& qp) {
    if (qp.carried) return qp.transport;  // until RESET (hca_bind.h)
    const RouteTable& routes = eng.routes();
    if (qp.route_gen != routes.generation()) {
        qp.transport = routes.lookup(qp.attr.ah.dlid);
        qp.route_gen = routes.generation();
    }
    return qp.transport;
}

enum class Step { Next, Stop };

// BIND_MW and LOCAL_INV (RC and UC QPs): they run once every WQE before
// them has completed, so that their completion keeps its place in the
// queue's order and a WQE after them sees the window as they left it. Over
// a transport that answers later, a local operation therefore waits for
// the responses before it, like a fence.
//
// On a QP a transport carries (the device) the shim checks and applies the
// operation to its own view of the window, and the transport may apply it
// to its own too and complete it (hca_transport.h).
Step run_local_op(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t st) {
    if (qp.req.sq_next != qp.sq.cons) return Step::Stop;  // resumed when the last response arrives
    const bool bind = w.hdr.opcode == IBV_WR_BIND_MW;
    Mw* mw = ctx.mws.get(bind ? w.hdr.mw_handle : ctx.keys.lookup(w.hdr.rkey, KeyKind::Mw));
    Transport* carrier = qp.carried ? qp.transport : nullptr;
    if (st == IBV_WC_SUCCESS && carrier) st = carrier->check_local_op(qp, mw, bind);
    if (st == IBV_WC_SUCCESS) {
        if (w.num_sge || w.is_inline) st = IBV_WC_LOC_QP_OP_ERR;
        else if (bind) st = bind_window(ctx, qp, w.hdr);
        else st = invalidate_local(ctx, qp, w.hdr.rkey);
    }
    if (st != IBV_WC_SUCCESS) return fail_head(eng, ctx, qp, st, &w), Step::Stop;
    switch (carrier ? carrier->post_local_op(eng, ctx, qp, mw, w, bind) : LocalOp::Shim) {
    case LocalOp::Posted:
        qp.req.sq_next = ring_next(qp.req.sq_next, qp.sq.entries);
        qp.req.inflight_carried = true;
        return Step::Next;
    case LocalOp::Failed:
        return fail_head(eng, ctx, qp, bind ? IBV_WC_MW_BIND_ERR : IBV_WC_LOC_QP_OP_ERR, &w), Step::Stop;
    case LocalOp::Shim:
        break;
    }
    complete_head(eng, ctx, qp, IBV_WC_SUCCESS, &w, 0);
    return Step::Next;
}

Step start_rc(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t st) {
    const uint32_t op = w.hdr.opcode;
    const bool idle = qp.req.sq_next == qp.sq.cons;
    // A local error completes only once everything before it has: it waits
    // for the queue in flight to drain.
    auto local_error = [&](uint32_t status) {
        if (idle) fail_head(eng, ctx, qp, status, &w);
        return Step::Stop;
    };
    if (st != IBV_WC_SUCCESS) return local_error(st);
    if (!is_verbs_request_opcode(op) || (w.is_inline && is_rdma_read_or_atomic(op))) return local_error(IBV_WC_LOC_QP_OP_ERR);
    if (qp.carried && !qp.transport->carries_opcode(op)) return local_error(IBV_WC_LOC_QP_OP_ERR);
    Transport* t = transport_of(eng, qp);
    Pins* pins = fresh_pins(eng, t);
    Span loc[abi::kMaxSge];
    uint32_t nl = 0;
    uint64_t len = 0;
    if (uint32_t e = resolve_local(ctx, qp, w, loc, nl, len, pins); e != IBV_WC_SUCCESS) return local_error(e);
    if (is_atomic(op) && len != 8) return local_error(IBV_WC_LOC_LEN_ERR);
    if (op == IBV_WR_ATOMIC_WRITE && len != 0) return local_error(IBV_WC_LOC_QP_OP_ERR);  // its value is in the WQE

    Request req;
    req.opcode = op;
    req.qp_type = IBV_QPT_RC;
    req.psn = qp.req.next_psn;
    stamp_source(ctx, qp, req);
    req.dlid = qp.attr.ah.dlid;
    req.dqpn = qp.attr.dest_qp_num;
    req.sl = qp.attr.ah.sl;
    req.solicited = (w.hdr.send_flags & IBV_SEND_SOLICITED) != 0;
    req.has_imm = op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    req.imm = w.hdr.imm_data;
    req.length = op == IBV_WR_ATOMIC_WRITE ? 8 : len;
    if (qp.xrc == XrcRole::Send) req.xrc_srqn = w.hdr.xrc_remote_srqn;
    req.rkey = w.hdr.rkey;
    req.remote_addr = w.hdr.remote_addr;
    req.compare_add = w.hdr.compare_add;
    req.swap = w.hdr.swap;
    req.inline_payload = w.is_inline;
    req.resend = psn_before(req.psn, qp.req.sent_high);
    req.wqe = &w;

    Response resp;
    SendResult sent = SendResult::Done;  // resp.syndrome is Drop: lost
    if (t && ctx.guest().port_active) sent = t->send(eng, ctx, qp, req, loc, nl, pins, resp);
    if (sent == SendResult::Busy) return Step::Stop;
    count_issued(ctx, req);
    qp.req.sq_next = ring_next(qp.req.sq_next, qp.sq.entries);
    qp.req.next_psn = psn_next(qp.req.next_psn);
    if (!req.resend) qp.req.sent_high = qp.req.next_psn;
    if (sent == SendResult::InFlight) {
        if (!qp.req.ack_deadline_ns) {
            qp.req.ack_since_ns = eng.now();
            qp.req.ack_deadline_ns = qp.req.ack_since_ns + ack_timeout_ns(qp.attr.timeout);
        }
        return Step::Next;
    }
    // Synchronous: the response is for this WQE, which is the head (a
    // synchronous transport never leaves anything in flight).
    on_head_response(eng, ctx, qp, resp, &w, loc, nl, len);
    return qp.req.wait == SqWait::None ? Step::Next : Step::Stop;
}

// How a UD or UC request went (send_unacked).
enum class Unacked { Wait, Later, Now };

// Hands the UD or UC request `req` to `t` (none, or the guest's port down:
// nothing goes, the message is lost and the send still succeeds). A WQE
// that would complete at once waits for the WQEs in flight before it
// (`idle` false): Wait, and it is handed over again later. Later: it stays
// in flight, with its PSN, until the device completes it or the fabric
// says its payload left the guest's memory (requester_sent); the next WQEs
// may go meanwhile. Now: `r` is the transport's answer (Drop if nothing
// went), and the WQE completes.
Unacked send_unacked(Engine& eng, Context& ctx, Qp& qp, const Request& req, Transport* t, const Span* loc,
                     uint32_t nl, Pins* pins, bool idle, Response& r) {
    const bool goes = t && ctx.guest().port_active;
    // Through the transport that carries the QP, the WQE completes through
    // it (requester_carried_done) and takes no PSN.
    const bool carried = qp.carried && t == qp.transport;
    if (!idle && (!goes || eng.is_here(t))) return Unacked::Wait;
    // What is in flight completes in order on one path: a UD QP on the
    // device switches between the device and TCP only once idle.
    if (!idle && carried != qp.req.inflight_carried) return Unacked::Wait;
    if (!goes) return Unacked::Now;
    const SendResult sent = t->send(eng, ctx, qp, req, loc, nl, pins, r);
    if (sent == SendResult::Busy) return Unacked::Wait;
    if (sent == SendResult::InFlight) {
        count_issued(ctx, req);
        if (!carried) {
            if (qp.req.sent_flags.size() != qp.sq.entries) qp.req.sent_flags.assign(qp.sq.entries, 0);
            qp.req.next_psn = psn_next(qp.req.next_psn);
        }
        qp.req.inflight_carried = carried;
        qp.req.sq_next = ring_next(qp.req.sq_next, qp.sq.entries);
        return Unacked::Later;
    }
    if (!idle) return Unacked::Wait;  // dropped (the peer is down): again once those before it completed
    count_issued(ctx, req);
    return Unacked::Now;
}

// A UD or UC WQE that fails before it is sent completes in order: once
// every WQE before it has (`idle`); until then the queue waits.
Step fail_after_sent(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t status, bool idle) {
    if (idle) fail_head(eng, ctx, qp, status, &w);
    return Step::Stop;
}

// The datagram of UD WQE `w` to the address `ah`, `len` bytes.
void fill_ud_request(Context& ctx, Qp& qp, const SendWork& w, const Ah& ah, uint64_t len, Request& req) {
    const abi::SendWqe& h = w.hdr;
    req.opcode = h.opcode;
    req.qp_type = IBV_QPT_UD;
    stamp_source(ctx, qp, req);
    req.dlid = ah.attr.dlid;
    req.dqpn = h.remote_qpn;
    req.sl = ah.attr.sl;
    req.solicited = (h.send_flags & IBV_SEND_SOLICITED) != 0;
    req.has_imm = h.opcode == IBV_WR_SEND_WITH_IMM;
    req.imm = h.imm_data;
    req.length = len;
    // A qkey with the high bit set means "use the QP's own".
    req.qkey = (h.remote_qkey & 0x80000000u) ? qp.attr.qkey : h.remote_qkey;
    if (ah.attr.is_global) {
        req.grh = true;
        req.traffic_class = ah.attr.traffic_class;
        req.hop_limit = ah.attr.hop_limit;
        req.flow_label = ah.attr.flow_label;
        make_gid(ctx.guest().guid, req.sgid);
        std::memcpy(req.dgid, ah.attr.dgid, 16);
    }
    req.inline_payload = w.is_inline;
    req.psn = qp.req.next_psn;
}

// A UD send to a multicast LID (multicast_delivery.h): the payload is
// gathered once into the engine's multicast buffer and copied from there
// to every member of the group, here and on the peer shims, before this
// returns. The WQE completes at once, or, behind WQEs still in flight (to
// a peer shim), once they have (it counts as sent: requester_sent). Only a
// datagram to QPN 0xffffff reaches a group, as IB requires; one to another
// QPN is sent and reaches nobody.
Step start_multicast(Engine& eng, Context& ctx, Qp& qp, SendWork& w, const Ah& ah, bool idle) {
    auto fail = [&](uint32_t status) { return fail_after_sent(eng, ctx, qp, w, status, idle); };
    Span loc[abi::kMaxSge];
    uint32_t nl = 0;
    uint64_t len = 0;
    if (uint32_t e = resolve_local(ctx, qp, w, loc, nl, len); e != IBV_WC_SUCCESS) return fail(e);
    if (len > kPortMtuBytes) return fail(IBV_WC_LOC_LEN_ERR);
    const Span staged{eng.multicast_payload(), len};
    if (len && copy_sg(&staged, 1, 0, loc, nl, 0, len) != CopyFault::None) return fail(IBV_WC_LOC_PROT_ERR);
    Request req;
    fill_ud_request(ctx, qp, w, ah, len, req);
    req.inline_payload = true;  // the staged copy, valid while the copies are made
    if (ctx.guest().port_active && req.dqpn == kMulticastQpn) multicast_send(eng, req, staged.p);
    count_issued(ctx, req);
    if (idle) {
        complete_head(eng, ctx, qp, IBV_WC_SUCCESS, &w, len);
        return Step::Next;
    }
    if (qp.req.sent_flags.size() != qp.sq.entries) qp.req.sent_flags.assign(qp.sq.entries, 0);
    qp.req.sent_flags[ring_slot(qp.req.sq_next, qp.sq.entries)] = 1;
    qp.req.next_psn = psn_next(qp.req.next_psn);
    qp.req.sq_next = ring_next(qp.req.sq_next, qp.sq.entries);
    return Step::Next;
}

Step start_ud(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t st) {
    const abi::SendWqe& h = w.hdr;
    const bool idle = qp.req.sq_next == qp.sq.cons;
    auto fail = [&](uint32_t status) { return fail_after_sent(eng, ctx, qp, w, status, idle); };
    if (st != IBV_WC_SUCCESS) return fail(st);
    if (h.opcode != IBV_WR_SEND && h.opcode != IBV_WR_SEND_WITH_IMM) return fail(IBV_WC_LOC_QP_OP_ERR);
    const Ah* ah = ctx.ahs.get(h.ah_handle);
    if (!ah || ah->pd != qp.pd) return fail(IBV_WC_LOC_QP_OP_ERR);
    if (is_multicast_lid(ah->attr.dlid)) return start_multicast(eng, ctx, qp, w, *ah, idle);
    // The transport that carries the QP takes the datagrams it can carry
    // (the device: to every UD QP on a device); the rest go by the route.
    Transport* t = qp.carried && qp.transport->carries_datagram(eng, ah->attr.dlid, h.remote_qpn)
                       ? qp.transport
                       : eng.routes().lookup(ah->attr.dlid);
    Pins* pins = fresh_pins(eng, t);
    Span loc[abi::kMaxSge];
    uint32_t nl = 0;
    uint64_t len = 0;
    if (uint32_t e = resolve_local(ctx, qp, w, loc, nl, len, pins); e != IBV_WC_SUCCESS) return fail(e);
    if (len > (t ? t->datagram_mtu() : kPortMtuBytes)) return fail(IBV_WC_LOC_LEN_ERR);

    Request req;
    fill_ud_request(ctx, qp, w, *ah, len, req);
    req.wqe = &w;
    req.sq_idx = qp.req.sq_next;
    Response r;
    const Unacked how = send_unacked(eng, ctx, qp, req, t, loc, nl, pins, idle, r);
    if (how != Unacked::Now) return how == Unacked::Wait ? Step::Stop : Step::Next;
    // Only the sender's own memory failing is the sender's error.
    if (r.syndrome == Syndrome::LocalFault) return fail(IBV_WC_LOC_PROT_ERR);
    complete_head(eng, ctx, qp, IBV_WC_SUCCESS, &w, len);
    return Step::Next;
}

// UC: the message goes to the connected QP with the next PSN and completes
// once it is sent (at once on this shim; over the fabric when its payload
// is written, requester_sent); no acknowledgement, no retry.
Step start_uc(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t st) {
    const abi::SendWqe& h = w.hdr;
    const bool idle = qp.req.sq_next == qp.sq.cons;
    auto fail = [&](uint32_t status) { return fail_after_sent(eng, ctx, qp, w, status, idle); };
    if (st != IBV_WC_SUCCESS) return fail(st);
    const bool send = h.opcode == IBV_WR_SEND || h.opcode == IBV_WR_SEND_WITH_IMM;
    const bool write = h.opcode == IBV_WR_RDMA_WRITE || h.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (!send && !write) return fail(IBV_WC_LOC_QP_OP_ERR);
    Transport* t = transport_of(eng, qp);
    Pins* pins = fresh_pins(eng, t);
    Span loc[abi::kMaxSge];
    uint32_t nl = 0;
    uint64_t len = 0;
    if (uint32_t e = resolve_local(ctx, qp, w, loc, nl, len, pins); e != IBV_WC_SUCCESS) return fail(e);

    Request req;
    req.opcode = h.opcode;
    req.qp_type = IBV_QPT_UC;
    req.psn = qp.req.next_psn;
    stamp_source(ctx, qp, req);
    req.dlid = qp.attr.ah.dlid;
    req.dqpn = qp.attr.dest_qp_num;
    req.sl = qp.attr.ah.sl;
    req.solicited = (h.send_flags & IBV_SEND_SOLICITED) != 0;
    req.has_imm = h.opcode == IBV_WR_SEND_WITH_IMM || h.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    req.imm = h.imm_data;
    req.length = len;
    req.rkey = h.rkey;
    req.remote_addr = h.remote_addr;
    req.inline_payload = w.is_inline;
    req.wqe = &w;
    req.sq_idx = qp.req.sq_next;
    Response r;
    const Unacked how = send_unacked(eng, ctx, qp, req, t, loc, nl, pins, idle, r);
    if (how != Unacked::Now) return how == Unacked::Wait ? Step::Stop : Step::Next;
    if (qp.carried && r.syndrome == Syndrome::LocalFault) return fail(IBV_WC_LOC_QP_OP_ERR);
    complete_head(eng, ctx, qp, IBV_WC_SUCCESS, &w, len);
    return Step::Next;
}

// Completes every posted send WQE (in flight or not) with
// IBV_WC_WR_FLUSH_ERR, signaled or not.
bool flush_sq(Context& ctx, Qp& qp) {
    uint32_t n;
    if (!wq_pending(qp.sq, n) || n == 0) return false;
    for (uint32_t i = 0; i < n; ++i) {
        abi::SendWqe hdr;
        std::memcpy(&hdr, qp.sq.slot(qp.sq.cons), sizeof(hdr));
        abi::Cqe c{};
        c.wr_id = hdr.wr_id;
        c.status = IBV_WC_WR_FLUSH_ERR;
        c.opcode = wc_opcode_for(hdr.opcode);
        c.qp_num = qp.qpn;
        wq_consume(qp.sq);
        cq_push(ctx, qp.send_cq, c);
    }
    qp.req.sq_next = qp.sq.cons;
    std::fill(qp.req.sent_flags.begin(), qp.req.sent_flags.end(), 0);
    return true;
}

bool flush_rq(Context& ctx, Qp& qp) {
    if (qp.srq) return false;
    uint32_t n;
    if (!wq_pending(qp.rq, n) || n == 0) return false;
    for (uint32_t i = 0; i < n; ++i) {
        abi::RecvWqe hdr;
        std::memcpy(&hdr, qp.rq.slot(qp.rq.cons), sizeof(hdr));
        abi::Cqe c{};
        c.wr_id = hdr.wr_id;
        c.status = IBV_WC_WR_FLUSH_ERR;
        c.opcode = IBV_WC_RECV;
        c.qp_num = qp.qpn;
        wq_consume(qp.rq);
        cq_push(ctx, qp.recv_cq, c);
    }
    return true;
}

}  // namespace

uint32_t wc_opcode_for(uint32_t wr_opcode) {
    switch (wr_opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
        return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
        return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
        return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_WRITE:
        return IBV_WC_ATOMIC_WRITE;
    case IBV_WR_BIND_MW:
        return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV:
        return IBV_WC_LOCAL_INV;
    default:
        return IBV_WC_SEND;
    }
}

void requester_start(Qp& qp) {
    qp.req.sq_next = qp.sq.cons;
    qp.req.una_psn = qp.req.next_psn = qp.req.sent_high = qp.attr.sq_psn & kPsnMask;
    qp.req.retries_left = qp.attr.retry_cnt;
    qp.req.rnr_left = qp.attr.rnr_retry;
    qp.req.wait = SqWait::None;
    qp.req.ack_deadline_ns = 0;
    qp.req.rewound = false;
}

void requester_reset(Qp& qp) {
    std::fill(qp.req.sent_flags.begin(), qp.req.sent_flags.end(), 0);
    qp.transport = nullptr;
    qp.route_gen = 0;
    qp.req.sq_next = qp.sq.cons;
    qp.req.una_psn = qp.req.next_psn = 0;
    qp.req.wait = SqWait::None;
    qp.req.ack_deadline_ns = 0;
    qp.req.rewound = false;
    qp.resp.epsn = 0;
    qp.resp.atomic_replay_valid = false;
    qp.resp.tm_rendezvous.clear();
}

void requester_begin_drain(Qp& qp) {
    // A WQE waiting for a timer was sent once: it still finishes.
    const bool waiting = qp.req.wait != SqWait::None && qp.req.sq_next == qp.sq.cons;
    qp.req.drain_end = waiting ? ring_next(qp.sq.cons, qp.sq.entries) : qp.req.sq_next;
}

bool requester_process(Engine& eng, Context& ctx, Qp& qp, uint64_t t, uint32_t max_wqes) {
    // A QP that failed on its own (a local error in the middle of a large
    // transfer) gives up the transfer: the peer's receive it took fails.
    if (qp.state == IBV_QPS_ERR || qp.state == IBV_QPS_SQE) abandon_transfer(eng, qp);
    if (qp.state == IBV_QPS_ERR) {
        if (!qp.resp.tm_rendezvous.empty()) tm_flush_rendezvous(ctx, qp);
        bool a = flush_sq(ctx, qp);
        bool b = flush_rq(ctx, qp);
        return a || b;
    }
    // Rendezvous reads a TM SRQ runs through this QP (tag_matching.h): its
    // receive side still works in SQE.
    if (!qp.resp.tm_rendezvous.empty()) tm_run_rendezvous(eng, ctx, qp);
    if (qp.state == IBV_QPS_SQE) return flush_sq(ctx, qp);
    for (Transport* k : eng.object_keepers()) k->qp_pass(eng, ctx, qp);  // a device QP takes the receives posted
    // SQD: no new WQE starts; those started (in flight, or waiting for an
    // RNR or retry timer) finish, and then the send queue is drained.
    const bool draining = qp.state == IBV_QPS_SQD && qp.req.draining;
    if (qp.state != IBV_QPS_RTS && !draining) return false;
    if (!qp.sq.ring) return false;  // an XRC_RECV QP: no send queue
    auto drained = [&] {
        qp.req.draining = false;
        if (qp.req.sqd_notify) post_qp_event(ctx, qp, IBV_EVENT_SQ_DRAINED);
        return true;
    };
    if (draining && qp.sq.cons == qp.req.drain_end && qp.req.wait == SqWait::None) return drained();

    bool progress = false;
    if (qp.req.wait != SqWait::None) {
        if (t < qp.req.deadline_ns) {
            ctx.note_deadline(qp.req.deadline_ns);
            return false;
        }
        if (qp.req.wait == SqWait::Retry) {
            if (qp.req.retries_left == 0) {
                qp.req.wait = SqWait::None;
                fail_head(eng, ctx, qp, IBV_WC_RETRY_EXC_ERR, nullptr);
                return true;
            }
            --qp.req.retries_left;
        }
        qp.req.wait = SqWait::None;  // send again from the oldest WQE
    }
    if (qp.req.ack_deadline_ns && t >= qp.req.ack_deadline_ns) {
        // The oldest request in flight got no response in time. Over a
        // reliable stream whose other end is still talking, it is late, not
        // lost (a drop is answered explicitly there): wait again.
        const uint64_t timeout = ack_timeout_ns(qp.attr.timeout);
        if (qp.transport && qp.transport->delivering_since(qp.req.ack_since_ns)) {
            qp.req.ack_deadline_ns = t + timeout;
            ctx.note_deadline(qp.req.ack_deadline_ns);
            return progress;
        }
        if (qp.req.retries_left == 0) {
            fail_head(eng, ctx, qp, IBV_WC_RETRY_EXC_ERR, nullptr);
            return true;
        }
        --qp.req.retries_left;
        rewind(qp);
        progress = true;
    }

    uint32_t n;
    if (!wq_pending(qp.sq, n) || inflight_count(qp) > n) {
        LOG_WARN("guest %s: QP %u: invalid send queue producer index", ctx.guest().name.c_str(), qp.qpn);
        qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
        return true;
    }
    uint32_t unsent = std::min(n - inflight_count(qp), max_wqes);
    if (draining) {
        uint32_t left = ring_count(qp.req.drain_end, qp.req.sq_next, qp.sq.entries);
        if (left < unsent) unsent = left;
    }
    const uint32_t run_state = qp.state;
    SendWork& w = eng.scratch();
    for (uint32_t i = 0; i < unsent && qp.state == run_state && qp.req.wait == SqWait::None; ++i) {
        if (eng.turns().spent_timed()) {
            ctx.mark_work(qp);  // the rest on the next pass (engine.h: work per turn)
            break;
        }
        eng.turns().charge(TurnScheduler::kWqeCost);
        uint32_t st = read_send_wqe(qp.sq, qp.req.sq_next, qp.max_send_sge, qp.max_inline, w);
        Step s = is_local_op(w.hdr.opcode) && qp.type != IBV_QPT_UD ? run_local_op(eng, ctx, qp, w, st)
                 : qp.type == IBV_QPT_UD                             ? start_ud(eng, ctx, qp, w, st)
                 : qp.type == IBV_QPT_UC ? start_uc(eng, ctx, qp, w, st)
                                         : start_rc(eng, ctx, qp, w, st);
        progress = true;
        if (s == Step::Stop) break;
    }
    ctx.note_deadline(qp.req.ack_deadline_ns);
    if (draining && qp.state == IBV_QPS_SQD && qp.sq.cons == qp.req.drain_end && qp.req.wait == SqWait::None)
        return drained();
    if (qp.state != run_state) ctx.request_rescan();  // flush what is left
    return progress;
}

void requester_on_response(Engine& eng, Context& ctx, Qp& qp, const Response& resp) {
    if (qp.type != IBV_QPT_RC || qp.req.sq_next == qp.sq.cons) return;
    if (qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_SQD) return;
    // From a peer on another shim: the connection binds to the incarnation
    // of the first QP that answers, and an answer from another one (an
    // earlier or later QP with that QPN) is not for this connection.
    if (resp.syndrome != Syndrome::Drop) {
        if (!resp.incarnation) return;
        if (!qp.peer_incarnation) qp.peer_incarnation = resp.incarnation;
        if (resp.incarnation != qp.peer_incarnation) return;
    }
    const uint32_t ahead = psn_diff(resp.psn, qp.req.una_psn);
    if (ahead >= inflight_count(qp)) return;  // stale, or not a PSN in flight
    // A sequence NAK naming the PSN the requester already went back to is
    // the echo of a request sent before it went back (a pipeline behind an
    // RNR NAK or a lost request earns one each, and they may come after
    // the resend): news only once. IB responders NAK a PSN once; these
    // transports answer every request, so the requester discards the echo.
    if (resp.syndrome == Syndrome::NakSeq && ahead == 0 && qp.req.rewound) return;
    if (resp.syndrome == Syndrome::NakSeq) {
        // Resend from the PSN the responder expects; what comes before it
        // was executed (its ACKs may still be on the way).
    } else if (ahead > 0) {
        // A cumulative ACK: it also acknowledges the SENDs and WRITEs before
        // it. READs and atomics are answered one by one (their data), so an
        // ACK never passes over one of them.
        if (resp.syndrome != Syndrome::Ack) return;
        // Each implied ACK completes its WQE as an ACK would; what an ACK
        // also does (head_acked: budgets, the timer, a clock read) is done
        // once, where the loop ends (below, by the ACK itself).
        for (uint32_t i = 0; i < ahead; ++i) {
            abi::SendWqe hdr;
            std::memcpy(&hdr, qp.sq.slot(qp.sq.cons), sizeof(hdr));
            if (is_rdma_read_or_atomic(hdr.opcode)) {
                if (i > 0) head_acked(eng, qp);
                return;
            }
            complete_head(eng, ctx, qp, IBV_WC_SUCCESS, nullptr, 0);
            if (qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_SQD) return head_acked(eng, qp);
        }
    }
    on_head_response(eng, ctx, qp, resp, nullptr, nullptr, 0, 0);
    ctx.mark_work(qp);  // the next WQEs may go now
}

void requester_carried_done(Engine& eng, Context& ctx, Qp& qp, uint32_t idx, uint32_t status) {
    // Only the head of what was posted: a QP flushed, reset or failed by
    // the shim since has completed it already.
    if (qp.req.sq_next == qp.sq.cons || idx != qp.sq.cons) return;
    if (qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_SQD) return;
    if (status != IBV_WC_SUCCESS) {
        // The device QP is in error: what it still holds comes back
        // flushed, and the shim's flush of the guest's queues answers it.
        complete_head(eng, ctx, qp, status, nullptr, 0);
        qp.req.sq_next = qp.sq.cons;
        if (qp.type == IBV_QPT_RC) {
            qp_set_error(ctx, qp, -1);
            eng.fail_responder_of(ctx, qp, status);
        } else {
            qp_set_sq_error(ctx, qp);
        }
        return;
    }
    complete_head(eng, ctx, qp, IBV_WC_SUCCESS, nullptr, 0);
    qp.req.ack_since_ns = eng.now();
    arm_ack_timer(qp);
}

void send_posted_datagrams(Engine& eng, Context& ctx, Qp& qp, uint32_t& allowance) {
    if (qp.type != IBV_QPT_UD || qp.state != IBV_QPS_RTS || !qp.sq.ring || !allowance) return;
    uint32_t n;
    if (!wq_pending(qp.sq, n) || n <= inflight_count(qp)) return;  // nothing waits to be taken
    const uint32_t unsent = n - inflight_count(qp);
    eng.turns().outside_budget([&] { requester_process(eng, ctx, qp, eng.now(), allowance); });
    uint32_t left = 0;
    if (qp.sq.ring && wq_pending(qp.sq, n) && n >= inflight_count(qp)) left = n - inflight_count(qp);
    allowance -= std::min(allowance, unsent > left ? unsent - left : 1u);
}

void requester_sent(Engine& eng, Context& ctx, Qp& qp, uint32_t idx) {
    // Only a WQE still in flight: a QP flushed or reset since has completed
    // it already.
    if (qp.req.sent_flags.size() != qp.sq.entries || ring_count(idx, qp.sq.cons, qp.sq.entries) >= inflight_count(qp))
        return;
    if (qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_SQD) return;
    qp.req.sent_flags[ring_slot(idx, qp.sq.entries)] = 1;
    // In order: the head, and those after it that were sent too.
    while (qp.req.sq_next != qp.sq.cons && qp.req.sent_flags[ring_slot(qp.sq.cons, qp.sq.entries)]) {
        qp.req.sent_flags[ring_slot(qp.sq.cons, qp.sq.entries)] = 0;
        complete_head(eng, ctx, qp, IBV_WC_SUCCESS, nullptr, 0);
    }
    ctx.mark_work(qp);  // the next WQEs, and a drain, may go on
}

void requester_local_error(Engine& eng, Context& ctx, Qp& qp, uint32_t psn, uint32_t status) {
    if (qp.type != IBV_QPT_RC || qp.req.sq_next == qp.sq.cons || psn != qp.req.una_psn) return;
    if (qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_SQD) return;
    fail_head(eng, ctx, qp, status, nullptr);
    ctx.mark_work(qp);
}

uint32_t requester_read_target(Engine& eng, Context& ctx, Qp& qp, uint32_t psn, Span* out, uint32_t& spans,
                               uint64_t& len, Pins* pins) {
    spans = 0;
    len = 0;
    uint32_t off = psn_diff(psn, qp.req.una_psn);
    if (off >= inflight_count(qp)) return IBV_WC_GENERAL_ERR;
    SendWork& s = eng.scratch();
    uint32_t idx = ring_advance(qp.sq.cons, off, qp.sq.entries);
    uint32_t st = read_send_wqe(qp.sq, idx, qp.max_send_sge, qp.max_inline, s);
    if (st != IBV_WC_SUCCESS) return st;
    if (s.hdr.opcode != IBV_WR_RDMA_READ || s.is_inline) return IBV_WC_LOC_QP_OP_ERR;
    return resolve_sges(ctx, qp.pd, s.sge, s.num_sge, IBV_ACCESS_LOCAL_WRITE, out, spans, len, pins);
}

Transport* requester_route(Engine& eng, Qp& qp) { return transport_of(eng, qp); }

void requester_stamp(const Context& ctx, const Qp& qp, Request& req) { stamp_source(ctx, qp, req); }

}  // namespace vrdma::shim
