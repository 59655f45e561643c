#include "responder.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cstring>

#include "async_events.h"
#include "cq_writer.h"
#include "engine.h"
#include "fault_guard.h"
#include "transport.h"
#include "memory_windows.h"
#include "psn.h"
#include "qkey_guard.h"
#include "qp_state.h"
#include "tag_matching.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {


// The receive queue a request consumes from: the QP's own or its SRQ.
struct RecvQueue {
    WorkQueue* wq = nullptr;
    Srq* srq = nullptr;
    uint32_t max_sge = 0;
};

// `xrc`: the XRC SRQ an XRC_RECV QP's request names (respond_rc found it).
RecvQueue recv_queue_of(Context& ctx, Qp& qp, Srq* xrc) {
    RecvQueue r;
    if (xrc) {
        r.srq = xrc;
        r.wq = &xrc->wq;
        r.max_sge = xrc->max_sge;
    } else if (qp.srq) {
        r.srq = ctx.srqs.get(qp.srq);
        // An SRQ that feeds the device has no WQE for the shim (hca_bind.h).
        if (r.srq && !r.srq->feeds_device) {
            r.wq = &r.srq->wq;
            r.max_sge = r.srq->max_sge;
        }
    } else {
        r.wq = &qp.rq;
        r.max_sge = qp.max_recv_sge;
    }
    return r;
}

// True if a receive WQE is posted. An invalid producer index puts the QP in
// error (and reads as "nothing posted").
bool recv_available(Context& ctx, Qp& qp, RecvQueue& rq, Srq* xrc = nullptr) {
    rq = recv_queue_of(ctx, qp, xrc);
    if (!rq.wq) return false;
    uint32_t n;
    if (!wq_pending(*rq.wq, n)) {
        qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
        return false;
    }
    return n > 0;
}

void consume_recv(Context& ctx, RecvQueue& rq) {
    wq_consume(*rq.wq);
    if (rq.srq) srq_wqe_consumed(ctx, *rq.srq, 0);
}

// Partitions: the sender must share a partition with the target QP (its
// P_Key, which its shim puts in the request, against the one at the target
// QP's pkey_index; pkeys_match); a mismatch is dropped, as an IB port
// drops a packet with a bad P_Key, and counted.
bool partition_ok(Engine& eng, const Request& req, Context& ctx, Qp& qp) {
    const auto& dk = ctx.guest().pkeys;
    const uint32_t di = qp.attr.pkey_index;
    if (di < dk.size() && pkeys_match(req.pkey, dk[di])) return true;
    GuestSecurity& s = eng.guests().security_of(ctx.guest());
    ++s.pkey_violations;
    unsigned long long more = 0;
    if (s.pkey_log.due(eng.now(), more)) {
        LOG_WARN("guest %s: QP %u: request from lid %u QPN %u (P_Key 0x%04x) dropped: no common partition "
                 "(%llu more since the last warning)",
                 ctx.guest().name.c_str(), qp.qpn, req.slid, req.sqpn, req.pkey,
                 more);
    }
    return false;
}

// Only the QP this one (RC or UC) is connected to may talk to it: the
// (LID, QPN) it names, and the very incarnation it is bound to, itself bound
// to this one, so that a QP that got a vanished peer's QPN is a stranger.
// A sender on this shim is checked against the truth; one on another shim
// by the incarnations its shim puts in the request: a request meant for an
// earlier QP with this QPN, or from another QP than the bound one, is a
// stranger. A connection to another shim binds on its first message
// (bind_remote_peer).
bool from_connected_peer(Engine& eng, const Request& req, Qp& qp) {
    if (qp.attr.dest_qp_num != req.sqpn || qp.attr.ah.dlid != req.slid) return false;
    if (eng.serves(req.slid)) {
        QpRef src = eng.qpns().find(req.slid, req.sqpn);
        return src && qp.peer_incarnation && src.qp->incarnation == qp.peer_incarnation &&
               src.qp->peer_incarnation == qp.incarnation;
    }
    if (!req.src_incarnation) return false;
    if (req.dst_incarnation && req.dst_incarnation != qp.incarnation) return false;
    return !qp.peer_incarnation || qp.peer_incarnation == req.src_incarnation;
}

// The XRC SRQ numbered `srqn` if it is in the domain of XRC_RECV QP `qp`.
Srq* xrc_target(Context& ctx, const Qp& qp, uint32_t srqn) {
    if (qp.xrc != XrcRole::Recv) return nullptr;
    auto it = ctx.xrc_srqs.find(srqn);
    if (it == ctx.xrc_srqs.end()) return nullptr;
    Srq* s = ctx.srqs.get(it->second);
    return s && s->xrcd == qp.xrcd ? s : nullptr;
}

// A connection to a QP on another shim is bound to the incarnation of the
// first peer message this QP accepts (a request in sequence, or an answer:
// requester_on_response).
void bind_remote_peer(Qp& qp, const Request& req) {
    if (!qp.peer_incarnation) qp.peer_incarnation = req.src_incarnation;
}

void set_recv_cqe(Delivery& d, const Request& req, uint64_t wr_id, uint32_t status, uint32_t opcode,
                  uint32_t byte_len) {
    abi::Cqe& c = d.cqe;
    c = abi::Cqe{};
    c.wr_id = wr_id;
    c.status = status;
    c.opcode = opcode;
    c.byte_len = byte_len;
    c.qp_num = d.qpn;
    c.src_qp = req.sqpn;
    c.slid = req.slid;
    c.sl = req.sl;
    if (status == IBV_WC_SUCCESS) {
        if (req.has_imm) {
            c.imm_data = req.imm;
            c.wc_flags |= IBV_WC_WITH_IMM;
        }
        if (req.qp_type == IBV_QPT_UD && req.grh) c.wc_flags |= IBV_WC_GRH;
        if (req.opcode == IBV_WR_SEND_WITH_INV) {
            c.imm_data = req.rkey;  // ibv_wc::invalidated_rkey shares imm_data's place, in host order
            c.wc_flags |= IBV_WC_WITH_INV;
        }
    }
    d.solicited = req.solicited;
    d.recv_cqe = true;
}

// Resolves the receive WQE at the head of `rq` into d.spans. Returns
// IBV_WC_SUCCESS or the status of the receive completion.
uint32_t take_recv_wqe(Context& ctx, Qp& qp, RecvQueue& rq, Delivery& d, uint64_t& wr_id, uint64_t& cap,
                       Pins* pins) {
    RecvWork rw;
    uint32_t st = read_recv_wqe(*rq.wq, rq.wq->cons, rq.max_sge, rw);
    wr_id = rw.wr_id;
    cap = 0;
    // An XRC SRQ's buffers are in its own PD (an XRC_RECV QP has none).
    const uint32_t pd = qp.xrc == XrcRole::Recv ? rq.srq->pd : qp.pd;
    if (st == IBV_WC_SUCCESS)
        st = resolve_sges(ctx, pd, rw.sge, rw.num_sge, IBV_ACCESS_LOCAL_WRITE, d.spans, d.nspans, cap, pins);
    consume_recv(ctx, rq);
    return st;
}

void respond_ud(Engine& eng, const Request& req, Delivery& d, Pins* pins) {
    d.resp.syndrome = Syndrome::Drop;
    QpRef dst = eng.qpns().find(req.dlid, req.dqpn);
    if (!dst || dst.qp->type != IBV_QPT_UD || !qp_takes_requests(dst.qp->state)) return;
    if (!dst.ctx->guest().port_active || !partition_ok(eng, req, *dst.ctx, *dst.qp)) return;
    if (!qkey_admits(eng, req, *dst.ctx, *dst.qp)) return;
    if (req.opcode != IBV_WR_SEND && req.opcode != IBV_WR_SEND_WITH_IMM) return;
    if (dst.qp->carried) {
        // Its receives are on the device (hca_ud.h): a datagram that came
        // another way finds none, and is lost.
        if (dst.qp->transport) dst.qp->transport->datagram_missed(*dst.qp);
        return;
    }
    if (req.length > kPortMtuBytes) return;
    RecvQueue rq;
    if (!recv_available(*dst.ctx, *dst.qp, rq)) return;  // a datagram with no receive is lost
    d.ctx = dst.ctx;
    d.qp = dst.qp;
    d.ctx_id = dst.ctx->id();
    d.qp_handle = dst.handle;
    d.qpn = dst.qp->qpn;
    d.recv_cq = dst.qp->recv_cq;
    uint64_t wr_id, cap;
    uint32_t st = take_recv_wqe(*dst.ctx, *dst.qp, rq, d, wr_id, cap, pins);
    if (st == IBV_WC_SUCCESS && cap < abi::kUdGrhBytes + req.length) st = IBV_WC_LOC_LEN_ERR;
    if (st != IBV_WC_SUCCESS) {
        d.nspans = 0;
        set_recv_cqe(d, req, wr_id, st, IBV_WC_RECV, 0);
        return;
    }
    if (req.grh) {
        uint8_t g[40];
        make_grh(req, g);
        Span gs{g, 40};
        if (copy_sg(d.spans, d.nspans, 0, &gs, 1, 40) != CopyFault::None) {
            d.nspans = 0;
            set_recv_cqe(d, req, wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0);
            return;
        }
    }
    d.resp.syndrome = Syndrome::Ack;
    d.skip = abi::kUdGrhBytes;
    d.length = req.length;
    set_recv_cqe(d, req, wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(abi::kUdGrhBytes + req.length));
}

void note_stranger(Engine& eng, Context& ctx, Qp& qp, const Request& req);

// UC: no acknowledgements, so nothing is ever answered and nothing waits.
// What RC would NAK or RNR-NAK is dropped here (the message is lost, as on
// a real fabric); the PSN only resynchronises (a gap is a lost message).
void respond_uc(Engine& eng, const Request& req, Delivery& d, Pins* pins) {
    d.resp.syndrome = Syndrome::Drop;
    d.resp.psn = req.psn;
    QpRef dst = eng.qpns().find(req.dlid, req.dqpn);
    if (!dst || dst.qp->type != IBV_QPT_UC || !qp_takes_requests(dst.qp->state)) return;
    Context& ctx = *dst.ctx;
    Qp& qp = *dst.qp;
    if (!ctx.guest().port_active) return;
    if (!from_connected_peer(eng, req, qp)) return note_stranger(eng, ctx, qp, req);
    if (!partition_ok(eng, req, ctx, qp)) return;
    const uint32_t op = req.opcode;
    const bool is_send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
    const bool is_write = op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    if ((!is_send && !is_write) || req.length > kMaxMsgSize) return;
    bind_remote_peer(qp, req);
    qp.resp.epsn = psn_next(req.psn);
    qp_request_arrived(ctx, qp);
    d.ctx = &ctx;
    d.qp = &qp;
    d.ctx_id = ctx.id();
    d.qp_handle = dst.handle;
    d.qpn = qp.qpn;
    d.recv_cq = qp.recv_cq;

    RecvQueue rq;
    const bool consumes = is_send || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (consumes && !recv_available(ctx, qp, rq)) return;  // no receive posted: lost
    if (is_send) {
        uint64_t wr_id, cap;
        uint32_t st = take_recv_wqe(ctx, qp, rq, d, wr_id, cap, pins);
        if (st == IBV_WC_SUCCESS && cap < req.length) st = IBV_WC_LOC_LEN_ERR;
        if (st != IBV_WC_SUCCESS) {
            // The receive completes in error; a bad receive WQE (not a
            // short buffer) also puts the QP in error.
            d.nspans = 0;
            set_recv_cqe(d, req, wr_id, st, IBV_WC_RECV, 0);
            if (st != IBV_WC_LOC_LEN_ERR) qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
            return;
        }
        set_recv_cqe(d, req, wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(req.length));
    } else {
        // An rkey, range or access violation drops the message, leaving the
        // receive queue untouched.
        if (req.length > 0) {
            if ((qp.attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) == 0) return;
            const std::shared_ptr<Mapping>* keep = nullptr;
            uint8_t* p =
                resolve_rkey(ctx, qp, qp.pd, req.rkey, req.remote_addr, req.length, IBV_ACCESS_REMOTE_WRITE, &keep);
            if (!p) return;
            if (pins && keep) pins->add(*keep);
            d.spans[0] = Span{p, req.length};
            d.nspans = 1;
        }
        if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            uint64_t wr_id, cap;
            Delivery scratch;  // the receive WQE's SGEs are not used by a write
            uint32_t st = take_recv_wqe(ctx, qp, rq, scratch, wr_id, cap, nullptr);
            if (st != IBV_WC_SUCCESS) {
                d.nspans = 0;
                set_recv_cqe(d, req, wr_id, st, IBV_WC_RECV_RDMA_WITH_IMM, 0);
                qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
                return;
            }
            set_recv_cqe(d, req, wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, uint32_t(req.length));
        }
    }
    d.resp.syndrome = Syndrome::Ack;  // never sent: it tells the transport to move the payload
    d.length = req.length;
}

// A request for `qp` from a QP it is not connected to: dropped, counted.
void note_stranger(Engine& eng, Context& ctx, Qp& qp, const Request& req) {
    ++qp.stranger_requests;
    GuestSecurity& s = eng.guests().security_of(ctx.guest());
    ++s.stranger_requests;
    unsigned long long more = 0;
    if (!s.stranger_log.due(eng.now(), more)) return;
    LOG_WARN("guest %s: QP %u: request from lid %u QPN %u dropped: not the QP it is connected to "
             "(%llu more since the last warning)",
             ctx.guest().name.c_str(), qp.qpn, req.slid, req.sqpn, more);
}

// A request with an rkey, range or access the responder refuses: counted.
void note_access_error(Engine& eng, Context& ctx, Qp& qp, const Request& req) {
    ++qp.remote_access_errors;
    GuestSecurity& s = eng.guests().security_of(ctx.guest());
    ++s.remote_access_errors;
    if (eng.guess_throttle().charge(req.slid, eng.now()))
        LOG_WARN("lid %u: over %u remote access errors a second (guessing keys?): its RDMA and atomic requests "
                 "are dropped while it goes on",
                 req.slid, eng.guess_throttle().limit());
    unsigned long long more = 0;
    if (!s.access_log.due(eng.now(), more)) return;
    LOG_WARN("guest %s: QP %u: remote access error from lid %u QPN %u (rkey 0x%x addr 0x%llx length %llu) "
             "(%llu more since the last warning)",
             ctx.guest().name.c_str(), qp.qpn, req.slid, req.sqpn, req.rkey, (unsigned long long)req.remote_addr,
             (unsigned long long)req.length, more);
}

// An RDMA request from a source that keeps guessing keys: dropped, counted.
void note_throttled(Engine& eng, Context& ctx, const Request& req) {
    GuestSecurity& s = eng.guests().security_of(ctx.guest());
    ++s.throttled_requests;
    unsigned long long more = 0;
    if (!s.throttle_log.due(eng.now(), more)) return;
    LOG_WARN("guest %s: RDMA request from lid %u QPN %u dropped: that source is throttled for guessing keys "
             "(%llu more since the last warning)",
             ctx.guest().name.c_str(), req.slid, req.sqpn, more);
}

// The responder QP fails with `event` and the requester gets `syndrome`.
void nak(Delivery& d, Context& ctx, Qp& qp, Syndrome syndrome, int event) {
    d.resp.syndrome = syndrome;
    d.nspans = 0;
    qp_set_error(ctx, qp, event);
}

// A rendezvous read or FIN of the QP `qp` is connected to, for a rendezvous
// this QP sent (request.h, tag_matching.h). Neither is in the PSN sequence
// nor touches it. A read is checked as an RDMA READ is; one refused fails
// that rendezvous only, as it would if both QPs were on one worker.
void respond_tm(Engine& eng, const Request& req, Delivery& d, Context& ctx, Qp& qp, Pins* pins) {
    if (qp.xrc != XrcRole::None || req.length > TurnScheduler::kSliceBytes) {
        d.resp.syndrome = Syndrome::NakInvReq;
        return;
    }
    if (req.opcode == kTmRndvFin) {
        uint8_t headers[32];
        std::memcpy(headers, req.sgid, 16);
        std::memcpy(headers + 16, req.dgid, 16);
        tm_deliver_fin(ctx, qp, headers, req.sqpn, req.slid);
        d.resp.syndrome = Syndrome::Ack;
        return;
    }
    if (req.length > 0) {
        const std::shared_ptr<Mapping>* keep = nullptr;
        uint8_t* p = (qp.attr.qp_access_flags & IBV_ACCESS_REMOTE_READ)
                         ? resolve_rkey(ctx, qp, qp.pd, req.rkey, req.remote_addr, req.length,
                                        IBV_ACCESS_REMOTE_READ, &keep)
                         : nullptr;
        if (!p) {
            note_access_error(eng, ctx, qp, req);
            d.resp.syndrome = Syndrome::NakAccess;
            return;
        }
        if (pins && keep) pins->add(*keep);
        d.spans[0] = Span{p, req.length};
        d.nspans = 1;
    }
    d.resp.syndrome = Syndrome::Ack;
    d.length = req.length;
}

void respond_rc(Engine& eng, const Request& req, Delivery& d, Pins* pins) {
    d.resp.syndrome = Syndrome::Drop;
    d.resp.psn = req.psn;
    d.resp.tm = is_tm_request(req.opcode);
    QpRef dst = eng.qpns().find(req.dlid, req.dqpn);
    // An XRC_SEND QP has no receive side: nothing is for it.
    if (!dst || dst.qp->type != IBV_QPT_RC || dst.qp->xrc == XrcRole::Send || !qp_takes_requests(dst.qp->state))
        return;
    Context& ctx = *dst.ctx;
    Qp& qp = *dst.qp;
    if (!ctx.guest().port_active) return;
    if (!from_connected_peer(eng, req, qp)) return note_stranger(eng, ctx, qp, req);
    if (!partition_ok(eng, req, ctx, qp)) return;
    if (req.opcode != IBV_WR_SEND && req.opcode != IBV_WR_SEND_WITH_IMM && eng.guess_throttle().anyone_throttled() &&
        eng.guess_throttle().throttled(req.slid, eng.now()))
        return note_throttled(eng, ctx, req);
    d.ctx = &ctx;
    d.qp = &qp;
    d.ctx_id = ctx.id();
    d.qp_handle = dst.handle;
    d.qpn = qp.qpn;
    d.recv_cq = qp.recv_cq;
    d.resp.incarnation = qp.incarnation;
    if (d.resp.tm) return respond_tm(eng, req, d, ctx, qp, pins);

    const uint32_t op = req.opcode;
    const bool is_send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV;
    // An atomic write is a write of 8 aligned bytes, stored at once.
    const bool is_atomic_write = op == IBV_WR_ATOMIC_WRITE;
    const bool is_write = op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM || is_atomic_write;
    const bool is_read = op == IBV_WR_RDMA_READ;
    const bool is_atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;

    // Sequence: a duplicate (a resend after a lost response) is answered
    // without executing it again, except READ (idempotent) and the last
    // atomic (its original value is replayed); a request from the future
    // means one was lost: NAK with the PSN expected.
    bool duplicate = false;
    if (req.psn != qp.resp.epsn) {
        if (!psn_before(req.psn, qp.resp.epsn)) {
            d.resp.syndrome = Syndrome::NakSeq;
            d.resp.psn = qp.resp.epsn;
            return;
        }
        duplicate = true;
        if (is_send || is_write) {
            d.resp.syndrome = Syndrome::Ack;
            return;
        }
        if (is_atomic) {
            if (qp.resp.atomic_replay_valid && qp.resp.atomic_replay_psn == req.psn) {
                d.resp.syndrome = Syndrome::Ack;
                d.resp.atomic_orig = qp.resp.atomic_replay_orig;
            } else {
                d.resp.syndrome = Syndrome::NakInvReq;
            }
            return;
        }
    }
    if (!is_send && !is_write && !is_read && !is_atomic) return nak(d, ctx, qp, Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
    if (req.length > kMaxMsgSize) return nak(d, ctx, qp, Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
    // XRC: the message names an XRC SRQ of the XRC_RECV QP's domain; it
    // consumes from that SRQ, completes into its CQ, and that SRQ's PD holds
    // the keys. Any other RC QP takes no SRQ number.
    Srq* xsrq = nullptr;
    if (qp.xrc == XrcRole::Recv || req.xrc_srqn) {
        xsrq = xrc_target(ctx, qp, req.xrc_srqn);
        if (!xsrq) return nak(d, ctx, qp, Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
        d.recv_cq = xsrq->cq;
    }
    const uint32_t pd = xsrq ? xsrq->pd : qp.pd;
    bind_remote_peer(qp, req);
    qp_request_arrived(ctx, qp);

    // A send to a QP on a TM SRQ is staged whole: the tag list decides
    // where it goes once it is there (tag_matching.h). Whatever else takes
    // one of its ordinary buffers completes into its CQ too.
    Srq* tsrq = !xsrq && qp.srq ? ctx.srqs.get(qp.srq) : nullptr;
    if (tsrq && !tsrq->tm) tsrq = nullptr;
    if (tsrq) d.recv_cq = tsrq->cq;
    if ((op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) && tsrq) {
        switch (tm_begin(eng, req, ctx, qp, *tsrq, d, pins)) {
        case TmBegin::Staged:
            break;
        case TmBegin::Rnr:
            d.resp.syndrome = Syndrome::RnrNak;
            d.resp.rnr_timer = qp.attr.min_rnr_timer;
            return;
        case TmBegin::TooLong:
            return nak(d, ctx, qp, Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
        case TmBegin::NoMemory:  // logged by the quota
            return nak(d, ctx, qp, Syndrome::NakOp, IBV_EVENT_QP_FATAL);
        case TmBegin::Error:
            return;  // the QP just failed: the request is lost
        }
        set_recv_cqe(d, req, 0, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(req.length));
        d.resp.syndrome = Syndrome::Ack;
        d.length = req.length;
        qp.resp.epsn = psn_next(qp.resp.epsn);
        return;
    }

    // A receive WQE first for what consumes one: no data moves before an RNR.
    RecvQueue rq;
    const bool consumes = is_send || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (consumes && !recv_available(ctx, qp, rq, xsrq)) {
        if (qp.state == IBV_QPS_ERR) return;  // it just failed: the request is lost
        d.resp.syndrome = Syndrome::RnrNak;
        d.resp.rnr_timer = qp.attr.min_rnr_timer;
        return;
    }

    if (is_send) {
        uint64_t wr_id, cap;
        uint32_t st = take_recv_wqe(ctx, qp, rq, d, wr_id, cap, pins);
        if (st != IBV_WC_SUCCESS) {
            set_recv_cqe(d, req, wr_id, st, IBV_WC_RECV, 0);
            return nak(d, ctx, qp, Syndrome::NakOp, IBV_EVENT_QP_FATAL);
        }
        if (cap < req.length) {
            set_recv_cqe(d, req, wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0);
            return nak(d, ctx, qp, Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
        }
        // Send with Invalidate frees a type 2 window of this QP before the
        // receive completes; an rkey that names none is a class J error, as
        // in rxe: both sides see a remote invalid request and fail.
        if (op == IBV_WR_SEND_WITH_INV && !invalidate_remote(ctx, qp, pd, req.rkey)) {
            note_access_error(eng, ctx, qp, req);
            set_recv_cqe(d, req, wr_id, IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV, 0);
            return nak(d, ctx, qp, Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
        }
        set_recv_cqe(d, req, wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(req.length));
    } else {
        // RDMA and atomics: an rkey of the responder's context, in the QP's
        // PD, with the access both the QP and the MR grant.
        uint32_t need = is_write ? IBV_ACCESS_REMOTE_WRITE : is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_ATOMIC;
        if ((is_atomic || is_atomic_write) && (req.length != 8 || (req.remote_addr & 7)))
            return nak(d, ctx, qp, Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
        if (req.length > 0) {
            const std::shared_ptr<Mapping>* keep = nullptr;
            uint8_t* p = (qp.attr.qp_access_flags & need) == need
                             ? resolve_rkey(ctx, qp, pd, req.rkey, req.remote_addr, req.length, need, &keep)
                             : nullptr;
            if (!p) {
                note_access_error(eng, ctx, qp, req);
                return nak(d, ctx, qp, Syndrome::NakAccess, IBV_EVENT_QP_ACCESS_ERR);
            }
            if (pins && keep) pins->add(*keep);
            d.spans[0] = Span{p, req.length};
            d.nspans = 1;
        }
        if (is_atomic) {
            auto* target = reinterpret_cast<uint64_t*>(d.spans[0].p);
            uint64_t old = 0;
            bool ok = op == IBV_WR_ATOMIC_FETCH_AND_ADD
                          ? guarded_fetch_add(target, req.compare_add, &old)
                          : guarded_compare_swap(target, req.compare_add, req.swap, &old);
            if (!ok) return nak(d, ctx, qp, Syndrome::NakAccess, IBV_EVENT_QP_ACCESS_ERR);
            d.resp.atomic_orig = old;
            d.nspans = 0;
            qp.resp.atomic_replay_valid = true;
            qp.resp.atomic_replay_psn = req.psn;
            qp.resp.atomic_replay_orig = old;
        }
        if (is_atomic_write) {
            if (!guarded_atomic_store(reinterpret_cast<uint64_t*>(d.spans[0].p), req.compare_add))
                return nak(d, ctx, qp, Syndrome::NakAccess, IBV_EVENT_QP_ACCESS_ERR);
            d.nspans = 0;
        }
        if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            uint64_t wr_id, cap;
            Delivery scratch;  // the receive WQE's SGEs are not used by a write
            uint32_t st = take_recv_wqe(ctx, qp, rq, scratch, wr_id, cap, nullptr);
            if (st != IBV_WC_SUCCESS) {
                set_recv_cqe(d, req, wr_id, st, IBV_WC_RECV_RDMA_WITH_IMM, 0);
                return nak(d, ctx, qp, Syndrome::NakOp, IBV_EVENT_QP_FATAL);
            }
            set_recv_cqe(d, req, wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, uint32_t(req.length));
        }
    }
    d.resp.syndrome = Syndrome::Ack;
    d.length = is_atomic || is_atomic_write ? 0 : req.length;
    if (!duplicate) qp.resp.epsn = psn_next(qp.resp.epsn);
}

}  // namespace

void make_grh(const Request& req, uint8_t out40[40]) {
    uint8_t g[40] = {};
    uint32_t ver = htonl((6u << 28) | (uint32_t(req.traffic_class) << 20) | (req.flow_label & 0xfffff));
    std::memcpy(g, &ver, 4);
    uint16_t plen = htons(uint16_t(req.length));
    std::memcpy(g + 4, &plen, 2);
    g[6] = 0x1b;  // next header: IBA transport
    g[7] = req.hop_limit;
    std::memcpy(g + 8, req.sgid, 16);
    std::memcpy(g + 24, req.dgid, 16);
    std::memcpy(out40, g, 40);
}

void responder_begin(Engine& eng, const Request& req, Delivery& d, Pins* pins) {
    d.opcode = req.opcode;
    if (req.qp_type == IBV_QPT_UD)
        respond_ud(eng, req, d, pins);
    else if (req.qp_type == IBV_QPT_UC)
        respond_uc(eng, req, d, pins);
    else
        respond_rc(eng, req, d, pins);
}

bool responder_revalidate(Engine& eng, Delivery& d) {
    d.ctx = nullptr;
    d.qp = nullptr;
    Context* ctx = eng.find_context(d.ctx_id);
    if (!ctx || ctx->dead) return false;
    Qp* qp = ctx->qps.get(d.qp_handle);
    if (!qp || qp->qpn != d.qpn || qp->state == IBV_QPS_RESET) return false;
    d.ctx = ctx;
    d.qp = qp;
    return true;
}

bool responder_still_there(Engine& eng, Delivery& d, uint32_t psn) {
    if (responder_revalidate(eng, d) && d.qp->state != IBV_QPS_ERR) return true;
    if (d.qp) {  // in error: its receive is flushed
        d.cqe.status = IBV_WC_WR_FLUSH_ERR;
        d.cqe.byte_len = 0;
        d.cqe.wc_flags = 0;
    }
    responder_finish(d);
    d.resp = Response{};
    d.resp.syndrome = Syndrome::Drop;
    d.resp.psn = psn;
    return false;
}

void responder_memory_fault(Delivery& d) {
    d.resp.syndrome = Syndrome::NakAccess;
    d.nspans = 0;
    if (!d.ctx || !d.qp) return;
    if (d.tm) {  // a staged message took no receive yet
        d.recv_cqe = false;
        d.qp->resp.tm_staging_busy = false;
    } else if (d.recv_cqe) {
        d.recv_cqe = false;
        d.cqe.status = IBV_WC_LOC_PROT_ERR;
        d.cqe.byte_len = 0;
        d.cqe.wc_flags = 0;
        cq_push(*d.ctx, d.recv_cq, d.cqe, d.solicited);
    }
    if (d.qp->type == IBV_QPT_RC) qp_set_error(*d.ctx, *d.qp, IBV_EVENT_QP_ACCESS_ERR);
}

void responder_end(Delivery& d, PayloadEnd how) {
    const bool live = d.ctx && d.qp;
    switch (how) {
    case PayloadEnd::Moved:
        if (live) responder_finish(d);
        return;
    case PayloadEnd::Lost:
        if (!live) return;
        if (d.recv_cqe)
            responder_finish(d, false);
        else if (d.qp->type == IBV_QPT_RC)
            qp_set_error(*d.ctx, *d.qp, IBV_EVENT_QP_FATAL);
        return;
    case PayloadEnd::RequesterFault:
        if (live && d.qp->type == IBV_QPT_RC)
            responder_finish(d, false);
        else if (live)
            responder_memory_fault(d);
        d.resp.syndrome = Syndrome::LocalFault;
        d.nspans = 0;
        return;
    case PayloadEnd::ResponderFault:
        if (live) responder_memory_fault(d);
        d.resp.syndrome = Syndrome::NakAccess;
        d.nspans = 0;
        return;
    }
}

void responder_finish(Delivery& d, bool payload_ok) {
    if (!d.recv_cqe || !d.ctx || !d.qp) return;
    if (d.tm) return tm_finish(d, payload_ok);
    d.recv_cqe = false;
    if (!payload_ok && d.cqe.status == IBV_WC_SUCCESS) {
        d.cqe.status = IBV_WC_REM_ABORT_ERR;
        d.cqe.byte_len = 0;
        d.cqe.wc_flags = 0;
        cq_push(*d.ctx, d.recv_cq, d.cqe, d.solicited);
        qp_set_error(*d.ctx, *d.qp, IBV_EVENT_QP_FATAL);
        return;
    }
    cq_push(*d.ctx, d.recv_cq, d.cqe, d.solicited);
}

}  // namespace vrdma::shim
