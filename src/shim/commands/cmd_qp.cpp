// CreateQp, ModifyQp, QueryQp, DestroyQp.
#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>

#include "async_events.h"
#include "sliced_transfer.h"
#include "commands.h"
#include "transport.h"
#include "qp_state.h"
#include "requester.h"
#include "vrdma/ring.h"
#include "work_queue.h"

namespace vrdma::shim {
namespace {

constexpr uint32_t kKnownQpMask = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY |
                                  IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
                                  IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_ALT_PATH |
                                  IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_PATH_MIG_STATE | IBV_QP_DEST_QPN;

int setup_wq(const Context& ctx, uint64_t gva, uint32_t entries, uint32_t stride, WorkQueue& wq) {
    HostRange ring;
    if (int err = map_ring(ctx, gva, abi::wq_ring_bytes(entries, stride), ring)) return err;
    wq.ring = reinterpret_cast<abi::RingHeader*>(ring.host);
    wq.slots = ring.host + abi::wq_slots_offset();
    wq.entries = entries;
    wq.stride = stride;
    wq.keep = std::move(ring.keepalive);
    wq_reset(wq);
    return 0;
}

// An RC or UC QP reaching RTR is bound to the incarnation of the QP it names, when
// that QP is on this shim: only that incarnation may talk to it
// (responder.cpp). A QPN that names nothing now stays bound to nothing.
void bind_peer(Engine& eng, Qp& qp) {
    qp.peer_incarnation = 0;
    if (!eng.serves(qp.attr.ah.dlid)) return;
    if (QpRef peer = eng.qpns().find(qp.attr.ah.dlid, qp.attr.dest_qp_num)) qp.peer_incarnation = peer.qp->incarnation;
}

// The end of every CreateQp: the QP gets its number and incarnation, a
// handle, and its work slot in the answer.
int publish_qp(Engine& eng, Context& ctx, std::unique_ptr<Qp> qp, uint32_t qpn, uint8_t* resp) {
    qp->qpn = qpn;
    qp->incarnation = eng.new_incarnation();
    qp->state = IBV_QPS_RESET;
    Qp* created = qp.get();
    uint32_t h = ctx.qps.insert(std::move(qp));
    if (!h) return ENOMEM;
    created->handle = h;
    eng.qpns().add(qpn, ctx, h);
    // Work slots are the QP table's slots modulo kWorkSlots: beyond 4096
    // QPs a bit names a few QPs, all looked at when it is set (engine.cpp).
    const uint32_t slot = ctx.qps.slot_of(h);
    store_resp(resp, abi::CmdCreateQpResp{h, qpn, slot % abi::kWorkSlots, 0});
    return 0;
}

// An XRC_RECV QP: nothing but its domain (no PD, CQs or queues; each
// message names the XRC SRQ it goes to). Not on a device.
int create_xrc_recv(Engine& eng, Context& ctx, const abi::CmdCreateQpReq& r, uint8_t* resp) {
    Xrcd* xrcd = ctx.xrcds.get(r.xrcd_handle);
    if (!xrcd) return EINVAL;
    if (r.pd_handle || r.send_cq_handle || r.recv_cq_handle || r.srq_handle || r.sq_gva || r.rq_gva ||
        r.sq_entries || r.rq_entries || r.max_send_sge || r.max_recv_sge || r.max_inline_data || r.sq_sig_all)
        return EINVAL;
    PendingCharges charge(ctx);
    if (!charge.take(Res::Qp, 1, "CreateQp")) return ENOMEM;
    auto qp = std::make_unique<Qp>();
    qp->type = IBV_QPT_RC;
    qp->xrc = XrcRole::Recv;
    qp->xrcd = r.xrcd_handle;
    qp->user_handle = r.user_handle;
    const uint32_t qpn = eng.qpns().alloc();
    if (!qpn) return ENOMEM;
    if (int err = publish_qp(eng, ctx, std::move(qp), qpn, resp)) return err;
    charge.keep();
    ++xrcd->users;
    return 0;
}

}  // namespace

int cmd_create_qp(Engine& eng, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdCreateQpReq>(req);
    if (r.qp_type == IBV_QPT_XRC_RECV) return create_xrc_recv(eng, ctx, r, resp);
    const Quotas& q = ctx.quotas();
    // XRC_SEND: an RC requester with no receive side, each message naming
    // its XRC SRQ (resources.h XrcRole).
    const bool xrc_send = r.qp_type == IBV_QPT_XRC_SEND;
    if (r.qp_type != IBV_QPT_RC && r.qp_type != IBV_QPT_UD && r.qp_type != IBV_QPT_UC && !xrc_send) return EINVAL;
    if (r.xrcd_handle) return EINVAL;
    if (xrc_send && (r.recv_cq_handle || r.srq_handle || r.rq_gva || r.rq_entries || r.max_recv_sge)) return EINVAL;
    Pd* pd = ctx.pds.get(r.pd_handle);
    Cq* scq = ctx.cqs.get(r.send_cq_handle);
    Cq* rcq = xrc_send ? nullptr : ctx.cqs.get(r.recv_cq_handle);
    if (!pd || !scq || (!rcq && !xrc_send)) return EINVAL;
    Srq* srq = nullptr;
    if (r.srq_handle) {
        srq = ctx.srqs.get(r.srq_handle);
        if (!srq || srq->xrcd) return EINVAL;  // an XRC SRQ takes messages of XRC_RECV QPs only
        if (srq->tm && r.qp_type != IBV_QPT_RC) return EINVAL;  // tag matching is for RC
        if (r.rq_gva || r.rq_entries) return EINVAL;
    }
    if (r.max_send_sge > q.max_sge || r.max_inline_data > q.max_inline || r.sq_sig_all > 1) return EINVAL;
    uint64_t sq_min = sizeof(abi::SendWqe) +
                      std::max<uint64_t>(uint64_t(r.max_send_sge) * sizeof(abi::Sge), r.max_inline_data);
    if (!wq_geometry_ok(r.sq_entries, q.max_qp_wr, r.sq_stride, sq_min)) return EINVAL;
    if (!srq && !xrc_send) {
        if (r.max_recv_sge > q.max_sge) return EINVAL;
        uint64_t rq_min = sizeof(abi::RecvWqe) + uint64_t(r.max_recv_sge) * sizeof(abi::Sge);
        if (!wq_geometry_ok(r.rq_entries, q.max_qp_wr, r.rq_stride, rq_min)) return EINVAL;
    }
    PendingCharges charge(ctx);
    if (!charge.take(Res::Qp, 1, "CreateQp") ||
        !charge.take(Res::Wr, uint64_t(r.sq_entries) + (srq ? 0 : r.rq_entries), "CreateQp"))
        return ENOMEM;

    auto qp = std::make_unique<Qp>();
    if (int err = setup_wq(ctx, r.sq_gva, r.sq_entries, r.sq_stride, qp->sq)) return err;
    if (!srq && !xrc_send)
        if (int err = setup_wq(ctx, r.rq_gva, r.rq_entries, r.rq_stride, qp->rq)) return err;
    // A transport's own QP (a device's: hca_bind.h) gives the QP its
    // number. XRC runs on this host and the TCP fabric only.
    uint32_t qpn = 0;
    if (!xrc_send)
        for (Transport* t : eng.object_keepers())
            if (!qpn) qpn = t->qp_made(eng, *pd, srq, *qp, r);
    if (!qpn) qpn = eng.qpns().alloc();
    if (!qpn) return ENOMEM;
    qp->type = xrc_send ? uint32_t(IBV_QPT_RC) : r.qp_type;
    qp->xrc = xrc_send ? XrcRole::Send : XrcRole::None;
    qp->pd = r.pd_handle;
    qp->send_cq = r.send_cq_handle;
    qp->recv_cq = rcq ? r.recv_cq_handle : 0;
    qp->srq = r.srq_handle;
    qp->max_send_sge = r.max_send_sge;
    qp->max_recv_sge = srq || xrc_send ? 0 : r.max_recv_sge;
    qp->max_inline = r.max_inline_data;
    qp->sig_all = r.sq_sig_all != 0;
    qp->user_handle = r.user_handle;
    if (int err = publish_qp(eng, ctx, std::move(qp), qpn, resp)) return err;
    charge.keep();
    ++pd->users;
    ++scq->users;
    if (rcq) ++rcq->users;
    if (srq) ++srq->users;
    return 0;
}

int cmd_modify_qp(Engine& eng, Context& ctx, const uint8_t* req, uint8_t*) {
    auto r = load_req<abi::CmdModifyQpReq>(req);
    Qp* qp = ctx.qps.get(r.qp_handle);
    if (!qp) return ENOENT;
    const uint32_t mask = r.attr_mask;
    if (mask & ~kKnownQpMask) return EINVAL;
    const uint32_t cur = qp->state;
    if ((mask & IBV_QP_CUR_STATE) && r.attr.cur_qp_state != cur) return EINVAL;
    const uint32_t next = (mask & IBV_QP_STATE) ? r.attr.qp_state : cur;
    const uint32_t table_type = qp->xrc == XrcRole::Send   ? uint32_t(IBV_QPT_XRC_SEND)
                                : qp->xrc == XrcRole::Recv ? uint32_t(IBV_QPT_XRC_RECV)
                                                           : qp->type;
    if (!qp_modify_is_ok(cur, next, table_type, mask)) return EINVAL;
    if (int err = qp_check_attr_values(r.attr, mask, ctx.quotas())) return err;
    if ((mask & IBV_QP_QKEY) && (r.attr.qkey & 0x80000000u) && !ctx.guest().controlled_qkeys) return EPERM;
    if ((mask & IBV_QP_PKEY_INDEX) && r.attr.pkey_index >= ctx.guest().pkeys.size()) return EINVAL;

    const abi::QpAttr before = qp->attr;
    qp_apply_attrs(*qp, r.attr, mask);
    for (Transport* t : eng.object_keepers()) {
        if (int err = t->qp_moving(eng, ctx, *qp, next)) {
            qp->attr = before;  // refused: the QP stays as it was
            return err;
        }
    }
    if (mask & IBV_QP_AV) qp->route_gen = 0;  // bind the transport of the new destination
    // A large local transfer this QP was moving stops here; its receive, if
    // it took one, completes in error at the responder.
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) abandon_transfer(eng, *qp);
    if (next == IBV_QPS_RESET) {
        // Back to a fresh QP: posted WQEs are dropped without completions.
        // The peer's requests now find it unconnected and time out
        // (RETRY_EXC_ERR), as on a fabric; it keeps its incarnation, so
        // connecting it again to the same peer works.
        qp->peer_incarnation = 0;
        wq_discard_all(qp->sq);
        if (!qp->srq) wq_discard_all(qp->rq);
        qp->attr = abi::QpAttr{};
        requester_reset(*qp);
        qp->state = IBV_QPS_RESET;
        qp->resp.comm_est_sent = false;
        qp->req.draining = false;
    } else if (next == IBV_QPS_ERR) {
        qp->state = IBV_QPS_ERR;
        qp->req.wait = SqWait::None;
        qp->req.ack_deadline_ns = 0;
        qp->req.draining = false;
        ctx.mark_work(*qp);  // its queues are flushed on this pass
        if (cur != IBV_QPS_ERR) qp_entered_error(ctx, *qp);
    } else {
        if (cur == IBV_QPS_SQE) qp->req.wait = SqWait::None;
        if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) qp->resp.epsn = qp->attr.rq_psn;
        if (qp->type != IBV_QPT_UD && ((cur == IBV_QPS_INIT && next == IBV_QPS_RTR) || (mask & IBV_QP_AV)))
            bind_peer(eng, *qp);
        if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) requester_start(*qp);
        if (next == IBV_QPS_SQD && cur == IBV_QPS_RTS) {
            // The requester finishes the WQEs in flight (if any), then
            // raises SQ_DRAINED when asked to (requester_process).
            requester_begin_drain(*qp);
            qp->req.draining = true;
            qp->req.sqd_notify = (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && r.attr.en_sqd_async_notify;
        } else if (next != IBV_QPS_SQD) {
            qp->req.draining = false;
        }
        qp->state = next;
        ctx.mark_work(*qp);  // what the guest posted before may go now
    }
    return 0;
}

int cmd_query_qp(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Qp* qp = ctx.qps.get(r.handle);
    if (!qp) return ENOENT;
    abi::CmdQueryQpResp out{};
    out.attr = qp->attr;
    out.attr.qp_state = qp->state;
    out.attr.cur_qp_state = qp->state;
    out.attr.max_send_wr = qp->sq.entries;
    out.attr.max_recv_wr = qp->srq ? 0 : qp->rq.entries;
    out.attr.max_send_sge = qp->max_send_sge;
    out.attr.max_recv_sge = qp->max_recv_sge;
    out.attr.max_inline_data = qp->max_inline;
    out.attr.sq_draining = qp->req.draining ? 1 : 0;
    store_resp(resp, out);
    return 0;
}

int cmd_destroy_qp(Engine& eng, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdHandleReq>(req);
    uint32_t allowance = kPostedDatagrams;
    if (Qp* live = ctx.qps.get(r.handle)) send_posted_datagrams(eng, ctx, *live, allowance);
    auto qp = ctx.qps.erase(r.handle);
    if (!qp) return ENOENT;
    abandon_transfer(eng, *qp);
    // Its peer is not told: as on a fabric, the peer's requests find nobody
    // and end in RETRY_EXC_ERR, and a QP that gets this QPN later is a
    // stranger to the peer (bind_peer), so they never reach it.
    ctx.charges.give(Res::Qp, 1);
    ctx.charges.give(Res::Wr, uint64_t(qp->sq.entries) + qp->rq.entries);
    store_resp(resp, abi::CmdDestroyResp{0, qp->async_events});
    eng.qpns().remove(qp->qpn);
    if (Pd* pd = ctx.pds.get(qp->pd)) --pd->users;
    if (Cq* cq = ctx.cqs.get(qp->send_cq)) --cq->users;
    if (Cq* cq = ctx.cqs.get(qp->recv_cq)) --cq->users;
    if (qp->srq)
        if (Srq* srq = ctx.srqs.get(qp->srq)) --srq->users;
    if (qp->xrc == XrcRole::Recv)
        if (Xrcd* x = ctx.xrcds.get(qp->xrcd)) --x->users;
    return 0;
}

}  // namespace vrdma::shim
