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
// Both are told by the incarnations in the request: a request meant for an
// earlier QP with this QPN, or from another QP than the bound one, is a
// stranger. A sender this engine serves built the request just now from its
// QP as it is (requester.cpp, stamp_source), with no wire in between, so its
// incarnations are the truth, and both QPs must be bound to each other. One
// on another shim or worker gets them from its shim; such a connection binds
// on its first message (bind_remote_peer).
bool from_connected_peer(Engine& eng, const Request& req, Qp& qp) {
    if (qp.attr.dest_qp_num != req.sqpn || qp.attr.ah.dlid != req.slid) return false;
    if (eng.serves(req.slid))
        return qp.peer_incarnation && req.src_incarnation == qp.peer_incarnation &&
               req.dst_incarnation == qp.incarnation;
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

// The responder as an explicit state machine, as rxe's is: each step checks
// one thing of the request against the target QP, or does one thing, and
// names the next step; a request leaves at Done with d.resp set (and, where
// it consumed a receive, the receive completion in d). Which steps a
// request takes depends on its QP type:
//   RC  FindQp CheckPeer CheckPartition CheckThrottle BindDelivery
//       (Rendezvous | CheckPsn [Duplicate]) CheckOpcode ChooseQueue
//       (StageTagged | CheckResource (TakeRecv | CheckRkey Execute)
//       [TakeImmRecv] Acknowledge)
//   UC  FindQp CheckPeer CheckPartition CheckOpcode BindDelivery
//       CheckResource (TakeRecv | CheckRkey) [TakeImmRecv] Acknowledge
//   UD  FindQp CheckPartition CheckQkey CheckOpcode CheckResource
//       BindDelivery TakeRecv Acknowledge
// Every step that refuses ends the request at once (dropped, NAKed, or
// with the QP in error); none moves a payload byte: the transport moves
// the payload after responder_begin returns, and one end,
// responder_end, finishes it.
enum class RespStep : uint8_t {
    FindQp,
    CheckPeer,
    CheckPartition,
    CheckQkey,
    CheckThrottle,
    BindDelivery,
    Rendezvous,
    CheckPsn,
    Duplicate,
    CheckOpcode,
    ChooseQueue,
    StageTagged,
    CheckResource,
    TakeRecv,
    CheckRkey,
    Execute,
    TakeImmRecv,
    Acknowledge,
    Done,
};

class ResponderRun {
public:
    ResponderRun(Engine& eng, const Request& req, Delivery& d, Pins* pins)
        : eng_(eng), req_(req), d_(d), pins_(pins), op_(req.opcode) {
        type_ = req.qp_type == IBV_QPT_UD ? IBV_QPT_UD : req.qp_type == IBV_QPT_UC ? IBV_QPT_UC : IBV_QPT_RC;
        const bool rc = type_ == IBV_QPT_RC;
        is_send_ = op_ == IBV_WR_SEND || op_ == IBV_WR_SEND_WITH_IMM || (rc && op_ == IBV_WR_SEND_WITH_INV);
        // An atomic write is a write of 8 aligned bytes, stored at once.
        is_atomic_write_ = rc && op_ == IBV_WR_ATOMIC_WRITE;
        is_write_ = op_ == IBV_WR_RDMA_WRITE || op_ == IBV_WR_RDMA_WRITE_WITH_IMM || is_atomic_write_;
        is_read_ = rc && op_ == IBV_WR_RDMA_READ;
        is_atomic_ = rc && (op_ == IBV_WR_ATOMIC_CMP_AND_SWP || op_ == IBV_WR_ATOMIC_FETCH_AND_ADD);
    }

    void run() {
        RespStep s = RespStep::FindQp;
        while (s != RespStep::Done) s = step(s);
    }

private:
    RespStep step(RespStep s) {
        switch (s) {
        case RespStep::FindQp: return find_qp();
        case RespStep::CheckPeer: return check_peer();
        case RespStep::CheckPartition: return check_partition();
        case RespStep::CheckQkey: return check_qkey();
        case RespStep::CheckThrottle: return check_throttle();
        case RespStep::BindDelivery: return bind_delivery();
        case RespStep::Rendezvous: return rendezvous();
        case RespStep::CheckPsn: return check_psn();
        case RespStep::Duplicate: return duplicate();
        case RespStep::CheckOpcode: return check_opcode();
        case RespStep::ChooseQueue: return choose_queue();
        case RespStep::StageTagged: return stage_tagged();
        case RespStep::CheckResource: return check_resource();
        case RespStep::TakeRecv: return take_recv();
        case RespStep::CheckRkey: return check_rkey();
        case RespStep::Execute: return execute();
        case RespStep::TakeImmRecv: return take_imm_recv();
        case RespStep::Acknowledge: return acknowledge();
        case RespStep::Done: break;
        }
        return RespStep::Done;
    }

    bool rc() const { return type_ == IBV_QPT_RC; }
    bool ud() const { return type_ == IBV_QPT_UD; }
    // The request takes a receive WQE (a send, a write with immediate).
    bool consumes() const { return is_send_ || op_ == IBV_WR_RDMA_WRITE_WITH_IMM; }

    // Ends the request with `syndrome` to the requester, the QP in error.
    RespStep fail(Syndrome syndrome, int event) {
        nak(d_, *ctx_, *qp_, syndrome, event);
        return RespStep::Done;
    }

    // The target: a QP of this worker of the request's type that takes
    // requests, on a port that is up. Anything else is dropped, as a
    // packet for no QP is. (An XRC_SEND QP has no receive side.)
    RespStep find_qp() {
        d_.resp.syndrome = Syndrome::Drop;
        if (!ud()) d_.resp.psn = req_.psn;
        if (rc()) d_.resp.tm = is_tm_request(op_);
        dst_ = eng_.qpns().find(req_.dlid, req_.dqpn);
        if (!dst_ || dst_.qp->type != type_ || dst_.qp->xrc == XrcRole::Send || !qp_takes_requests(dst_.qp->state))
            return RespStep::Done;
        ctx_ = dst_.ctx;
        qp_ = dst_.qp;
        if (!ctx_->guest().port_active) return RespStep::Done;
        return ud() ? RespStep::CheckPartition : RespStep::CheckPeer;
    }

    // RC and UC: only the QP this one is connected to (from_connected_peer).
    RespStep check_peer() {
        if (!from_connected_peer(eng_, req_, *qp_)) {
            note_stranger(eng_, *ctx_, *qp_, req_);
            return RespStep::Done;
        }
        return RespStep::CheckPartition;
    }

    RespStep check_partition() {
        if (!partition_ok(eng_, req_, *ctx_, *qp_)) return RespStep::Done;
        return ud() ? RespStep::CheckQkey : rc() ? RespStep::CheckThrottle : RespStep::CheckOpcode;
    }

    RespStep check_qkey() { return qkey_admits(eng_, req_, *ctx_, *qp_) ? RespStep::CheckOpcode : RespStep::Done; }

    // RC: the RDMA and atomic requests of a source that keeps guessing keys
    // are dropped unexamined (guess_throttle.h); its sends are not.
    RespStep check_throttle() {
        GuessThrottle& t = eng_.guess_throttle();
        if (op_ != IBV_WR_SEND && op_ != IBV_WR_SEND_WITH_IMM && t.anyone_throttled() &&
            t.throttled(req_.slid, eng_.now())) {
            note_throttled(eng_, *ctx_, req_);
            return RespStep::Done;
        }
        return RespStep::BindDelivery;
    }

    // The delivery names its target from here on (responder_revalidate
    // finds it again). UC resynchronises its PSN to the request's: a gap is
    // a lost message, and nothing is ever answered.
    RespStep bind_delivery() {
        d_.ctx = ctx_;
        d_.qp = qp_;
        d_.ctx_id = ctx_->id();
        d_.qp_handle = dst_.handle;
        d_.qpn = qp_->qpn;
        d_.recv_cq = qp_->recv_cq;
        if (ud()) return RespStep::TakeRecv;
        if (!rc()) {
            bind_remote_peer(*qp_, req_);
            qp_->resp.epsn = psn_next(req_.psn);
            qp_request_arrived(*ctx_, *qp_);
            return RespStep::CheckResource;
        }
        d_.resp.incarnation = qp_->incarnation;
        return d_.resp.tm ? RespStep::Rendezvous : RespStep::CheckPsn;
    }

    RespStep rendezvous() {
        respond_tm(eng_, req_, d_, *ctx_, *qp_, pins_);
        return RespStep::Done;
    }

    // RC sequence: a request from the future means one was lost: NAK with
    // the PSN expected; one from the past is a duplicate (a resend after a
    // lost response).
    RespStep check_psn() {
        if (req_.psn == qp_->resp.epsn) return RespStep::CheckOpcode;
        if (!psn_before(req_.psn, qp_->resp.epsn)) {
            d_.resp.syndrome = Syndrome::NakSeq;
            d_.resp.psn = qp_->resp.epsn;
            return RespStep::Done;
        }
        duplicate_ = true;
        return RespStep::Duplicate;
    }

    // A duplicate is answered without executing it again, except a READ
    // (idempotent: executed again) and the last atomic (its original value
    // is replayed).
    RespStep duplicate() {
        if (is_send_ || is_write_) {
            d_.resp.syndrome = Syndrome::Ack;
            return RespStep::Done;
        }
        if (is_atomic_) {
            if (qp_->resp.atomic_replay_valid && qp_->resp.atomic_replay_psn == req_.psn) {
                d_.resp.syndrome = Syndrome::Ack;
                d_.resp.atomic_orig = qp_->resp.atomic_replay_orig;
            } else {
                d_.resp.syndrome = Syndrome::NakInvReq;
            }
            return RespStep::Done;
        }
        return RespStep::CheckOpcode;
    }

    // What the QP type carries, and no longer than a message may be. RC
    // NAKs what it cannot execute; UC and UD drop it.
    RespStep check_opcode() {
        if (ud()) {
            if (!is_send_) return RespStep::Done;
            if (qp_->carried) {
                // Its receives are on the device (hca_ud.h): a datagram
                // that came another way finds none, and is lost.
                if (qp_->transport) qp_->transport->datagram_missed(*qp_);
                return RespStep::Done;
            }
            return req_.length > kPortMtuBytes ? RespStep::Done : RespStep::CheckResource;
        }
        const bool valid = is_send_ || is_write_ || is_read_ || is_atomic_;
        if (!rc()) return valid && req_.length <= kMaxMsgSize ? RespStep::BindDelivery : RespStep::Done;
        if (!valid || req_.length > kMaxMsgSize) return fail(Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
        return RespStep::ChooseQueue;
    }

    // RC: the queue the request consumes from and completes into, and the
    // PD that holds the keys. XRC: the message names an XRC SRQ of the
    // XRC_RECV QP's domain; it consumes from that SRQ, completes into its
    // CQ, and that SRQ's PD holds the keys (any other RC QP takes no SRQ
    // number). A send to a QP on a TM SRQ is staged whole: the tag list
    // decides where it goes once it is there (tag_matching.h); whatever
    // else takes one of its ordinary buffers completes into its CQ too.
    RespStep choose_queue() {
        if (qp_->xrc == XrcRole::Recv || req_.xrc_srqn) {
            xsrq_ = xrc_target(*ctx_, *qp_, req_.xrc_srqn);
            if (!xsrq_) return fail(Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
            d_.recv_cq = xsrq_->cq;
        }
        pd_ = xsrq_ ? xsrq_->pd : qp_->pd;
        bind_remote_peer(*qp_, req_);
        qp_request_arrived(*ctx_, *qp_);
        tsrq_ = !xsrq_ && qp_->srq ? ctx_->srqs.get(qp_->srq) : nullptr;
        if (tsrq_ && !tsrq_->tm) tsrq_ = nullptr;
        if (tsrq_) d_.recv_cq = tsrq_->cq;
        const bool plain_send = op_ == IBV_WR_SEND || op_ == IBV_WR_SEND_WITH_IMM;
        return plain_send && tsrq_ ? RespStep::StageTagged : RespStep::CheckResource;
    }

    RespStep stage_tagged() {
        switch (tm_begin(eng_, req_, *ctx_, *qp_, *tsrq_, d_, pins_)) {
        case TmBegin::Staged:
            break;
        case TmBegin::Rnr:
            d_.resp.syndrome = Syndrome::RnrNak;
            d_.resp.rnr_timer = qp_->attr.min_rnr_timer;
            return RespStep::Done;
        case TmBegin::TooLong:
            return fail(Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
        case TmBegin::NoMemory:  // logged by the quota
            return fail(Syndrome::NakOp, IBV_EVENT_QP_FATAL);
        case TmBegin::Error:
            return RespStep::Done;  // the QP just failed: the request is lost
        }
        set_recv_cqe(d_, req_, 0, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(req_.length));
        d_.resp.syndrome = Syndrome::Ack;
        d_.length = req_.length;
        qp_->resp.epsn = psn_next(qp_->resp.epsn);
        return RespStep::Done;
    }

    // A receive WQE first for what consumes one: no data moves before an
    // RNR (RC), and without one a UC message or a datagram is lost.
    RespStep check_resource() {
        if (ud()) return recv_available(*ctx_, *qp_, rq_) ? RespStep::BindDelivery : RespStep::Done;
        if (consumes() && !recv_available(*ctx_, *qp_, rq_, xsrq_)) {
            if (!rc() || qp_->state == IBV_QPS_ERR) return RespStep::Done;  // lost (UC), or the QP just failed
            d_.resp.syndrome = Syndrome::RnrNak;
            d_.resp.rnr_timer = qp_->attr.min_rnr_timer;
            return RespStep::Done;
        }
        return is_send_ ? RespStep::TakeRecv : RespStep::CheckRkey;
    }

    // A send's receive WQE: where the payload goes. A bad WQE or a buffer
    // too short completes the receive in error; RC also NAKs and fails the
    // QP, UC fails it for a bad WQE only, UD loses just the datagram.
    RespStep take_recv() {
        uint64_t cap;
        uint32_t st = take_recv_wqe(*ctx_, *qp_, rq_, d_, wr_id_, cap, pins_);
        const uint64_t need = ud() ? abi::kUdGrhBytes + req_.length : req_.length;
        if (rc()) {
            if (st != IBV_WC_SUCCESS) {
                set_recv_cqe(d_, req_, wr_id_, st, IBV_WC_RECV, 0);
                return fail(Syndrome::NakOp, IBV_EVENT_QP_FATAL);
            }
            if (cap < need) {
                set_recv_cqe(d_, req_, wr_id_, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0);
                return fail(Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
            }
            // Send with Invalidate frees a type 2 window of this QP before
            // the receive completes; an rkey that names none is a class J
            // error, as in rxe: both sides see a remote invalid request.
            if (op_ == IBV_WR_SEND_WITH_INV && !invalidate_remote(*ctx_, *qp_, pd_, req_.rkey)) {
                note_access_error(eng_, *ctx_, *qp_, req_);
                set_recv_cqe(d_, req_, wr_id_, IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV, 0);
                return fail(Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
            }
            set_recv_cqe(d_, req_, wr_id_, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(req_.length));
            return RespStep::Acknowledge;
        }
        if (st == IBV_WC_SUCCESS && cap < need) st = IBV_WC_LOC_LEN_ERR;
        if (st == IBV_WC_SUCCESS && ud() && req_.grh) {
            uint8_t g[40];
            make_grh(req_, g);
            Span gs{g, 40};
            if (copy_sg(d_.spans, d_.nspans, 0, &gs, 1, 40) != CopyFault::None) st = IBV_WC_LOC_PROT_ERR;
        }
        if (st != IBV_WC_SUCCESS) {
            d_.nspans = 0;
            set_recv_cqe(d_, req_, wr_id_, st, IBV_WC_RECV, 0);
            if (!ud() && st != IBV_WC_LOC_LEN_ERR) qp_set_error(*ctx_, *qp_, IBV_EVENT_QP_FATAL);
            return RespStep::Done;
        }
        if (!ud()) set_recv_cqe(d_, req_, wr_id_, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(req_.length));
        return RespStep::Acknowledge;
    }

    // RDMA and atomics: an rkey of the responder's context, in the QP's PD,
    // with the access both the QP and the MR grant. RC counts and NAKs a
    // refusal (the QP fails); UC drops the message, its receive queue
    // untouched.
    RespStep check_rkey() {
        const uint32_t need = is_write_  ? IBV_ACCESS_REMOTE_WRITE
                              : is_read_ ? IBV_ACCESS_REMOTE_READ
                                         : IBV_ACCESS_REMOTE_ATOMIC;
        if ((is_atomic_ || is_atomic_write_) && (req_.length != 8 || (req_.remote_addr & 7)))
            return fail(Syndrome::NakInvReq, IBV_EVENT_QP_REQ_ERR);
        if (req_.length > 0) {
            const std::shared_ptr<Mapping>* keep = nullptr;
            const uint32_t pd = rc() ? pd_ : qp_->pd;
            uint8_t* p = (qp_->attr.qp_access_flags & need) == need
                             ? resolve_rkey(*ctx_, *qp_, pd, req_.rkey, req_.remote_addr, req_.length, need, &keep)
                             : nullptr;
            if (!p) {
                if (!rc()) return RespStep::Done;
                note_access_error(eng_, *ctx_, *qp_, req_);
                return fail(Syndrome::NakAccess, IBV_EVENT_QP_ACCESS_ERR);
            }
            if (pins_ && keep) pins_->add(*keep);
            d_.spans[0] = Span{p, req_.length};
            d_.nspans = 1;
        }
        if (rc()) return RespStep::Execute;
        return op_ == IBV_WR_RDMA_WRITE_WITH_IMM ? RespStep::TakeImmRecv : RespStep::Acknowledge;
    }

    // RC atomics run here, at once; the original value of the last one is
    // kept to answer its duplicate.
    RespStep execute() {
        if (is_atomic_) {
            auto* target = reinterpret_cast<uint64_t*>(d_.spans[0].p);
            uint64_t old = 0;
            const bool ok = op_ == IBV_WR_ATOMIC_FETCH_AND_ADD
                                ? guarded_fetch_add(target, req_.compare_add, &old)
                                : guarded_compare_swap(target, req_.compare_add, req_.swap, &old);
            if (!ok) return fail(Syndrome::NakAccess, IBV_EVENT_QP_ACCESS_ERR);
            d_.resp.atomic_orig = old;
            d_.nspans = 0;
            qp_->resp.atomic_replay_valid = true;
            qp_->resp.atomic_replay_psn = req_.psn;
            qp_->resp.atomic_replay_orig = old;
        }
        if (is_atomic_write_) {
            if (!guarded_atomic_store(reinterpret_cast<uint64_t*>(d_.spans[0].p), req_.compare_add))
                return fail(Syndrome::NakAccess, IBV_EVENT_QP_ACCESS_ERR);
            d_.nspans = 0;
        }
        return op_ == IBV_WR_RDMA_WRITE_WITH_IMM ? RespStep::TakeImmRecv : RespStep::Acknowledge;
    }

    // A write with immediate takes a receive WQE for its completion; its
    // SGEs are not used. A bad one fails the QP.
    RespStep take_imm_recv() {
        uint64_t cap;
        Delivery scratch;
        const uint32_t st = take_recv_wqe(*ctx_, *qp_, rq_, scratch, wr_id_, cap, nullptr);
        if (st != IBV_WC_SUCCESS) {
            set_recv_cqe(d_, req_, wr_id_, st, IBV_WC_RECV_RDMA_WITH_IMM, 0);
            if (rc()) return fail(Syndrome::NakOp, IBV_EVENT_QP_FATAL);
            d_.nspans = 0;
            qp_set_error(*ctx_, *qp_, IBV_EVENT_QP_FATAL);
            return RespStep::Done;
        }
        set_recv_cqe(d_, req_, wr_id_, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, uint32_t(req_.length));
        return RespStep::Acknowledge;
    }

    // Executed: the transport moves the payload (UC's Ack is never sent:
    // it tells the transport to move it). RC expects the next PSN.
    RespStep acknowledge() {
        d_.resp.syndrome = Syndrome::Ack;
        if (ud()) {
            d_.skip = abi::kUdGrhBytes;
            d_.length = req_.length;
            set_recv_cqe(d_, req_, wr_id_, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(abi::kUdGrhBytes + req_.length));
            return RespStep::Done;
        }
        d_.length = is_atomic_ || is_atomic_write_ ? 0 : req_.length;
        if (rc() && !duplicate_) qp_->resp.epsn = psn_next(qp_->resp.epsn);
        return RespStep::Done;
    }

    Engine& eng_;
    const Request& req_;
    Delivery& d_;
    Pins* pins_;
    const uint32_t op_;
    uint32_t type_;
    bool is_send_ = false, is_write_ = false, is_read_ = false, is_atomic_ = false, is_atomic_write_ = false;
    bool duplicate_ = false;
    QpRef dst_;
    Context* ctx_ = nullptr;
    Qp* qp_ = nullptr;
    Srq* xsrq_ = nullptr;  // the XRC SRQ the request names
    Srq* tsrq_ = nullptr;  // the QP's tag-matching SRQ
    uint32_t pd_ = 0;
    RecvQueue rq_;
    uint64_t wr_id_ = 0;
};
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
    ResponderRun(eng, req, d, pins).run();
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
