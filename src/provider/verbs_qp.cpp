// Queue pairs: creation (ring sizing), modify, query, destroy.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "context.h"
#include "events.h"
#include "objects.h"
#include "verbs.h"

namespace vrdma::prov {
namespace {

uint64_t pow2_at_least(uint64_t v) {
    uint64_t p = 1;
    while (p < v) p <<= 1;
    return p;
}

struct QpCreate {
    ibv_pd* pd;
    ibv_qp_type type;
    ibv_cq* send_cq;
    ibv_cq* recv_cq;
    ibv_srq* srq;
    ibv_qp_cap* cap;
    int sq_sig_all;
    void* qp_context;
    bool ex;
    uint64_t send_ops_flags;
};

// The QP the shim made, as the application sees it (the fields libibverbs
// leaves to the provider), and known to the event code.
ibv_qp* publish(Qp& qp, const QpCreate& c, ibv_context* ibctx, ibv_cq* recv_cq, ibv_srq* srq,
                const abi::CmdCreateQpResp& resp) {
    qp.handle = resp.qp_handle;
    // A slot the shim cannot have given (a bad reply) is not used: such a
    // QP rings the doorbell counter, which always works.
    const uint32_t slot = resp.work_slot < abi::kWorkSlots ? resp.work_slot : abi::kNoWorkSlot;
    qp.sq.work_slot = qp.rq.work_slot = slot;
    ibv_qp& q = qp.vqp.qp;
    q.context = ibctx;
    q.qp_context = c.qp_context;
    q.pd = c.pd;
    q.send_cq = c.send_cq;
    q.recv_cq = recv_cq;
    q.srq = srq;
    q.handle = resp.qp_handle;
    q.qp_num = resp.qpn;
    q.state = IBV_QPS_RESET;
    q.qp_type = c.type;
    pthread_mutex_init(&q.mutex, nullptr);
    pthread_cond_init(&q.cond, nullptr);
    q.events_completed = 0;
    if (c.ex) {
        qp.vqp.comp_mask |= VRDMA_VERBS_QP_EX;
        install_qp_ex_ops(qp, c.send_ops_flags);
    }
    Context& ctx = *qp.ctx;
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_qps.insert(&q);
    return &q;
}

ibv_qp* create_common(const QpCreate& c) {
    Context& ctx = ctx_of(c.pd->context);
    const abi::DeviceAttr& d = ctx.dev_attr;
    if (c.type != IBV_QPT_RC && c.type != IBV_QPT_UC && c.type != IBV_QPT_UD && c.type != IBV_QPT_XRC_SEND) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    // An XRC_SEND QP receives nothing: a receive CQ or SRQ given for it is
    // ignored, as the kernel does.
    const bool xrc_send = c.type == IBV_QPT_XRC_SEND;
    ibv_cq* const recv_cq = xrc_send ? nullptr : c.recv_cq;
    ibv_srq* const srq_in = xrc_send ? nullptr : c.srq;
    const bool own_rq = !srq_in && !xrc_send;
    ibv_qp_cap& cap = *c.cap;
    uint32_t max_sge = std::min(d.max_sge, abi::kMaxSge);
    uint32_t max_inline = std::min(d.max_inline_data, abi::kMaxInline);
    // Objects of another context: their handles mean nothing to this one's
    // shim (a kernel device answers EINVAL for a handle it does not know).
    bool foreign = (c.send_cq && c.send_cq->context != c.pd->context) ||
                   (recv_cq && recv_cq->context != c.pd->context) || (srq_in && srq_in->context != c.pd->context);
    if (foreign || !c.send_cq || (!recv_cq && !xrc_send) || cap.max_send_wr > d.max_qp_wr ||
        cap.max_send_sge > max_sge || cap.max_inline_data > max_inline ||
        (own_rq && (cap.max_recv_wr > d.max_qp_wr || cap.max_recv_sge > max_sge))) {
        errno = EINVAL;
        return nullptr;
    }

    auto* qp = new (std::nothrow) Qp{};
    if (!qp) {
        errno = ENOMEM;
        return nullptr;
    }
    qp->ctx = &ctx;

    // Send queue geometry.
    uint64_t sq_entries = pow2_at_least(std::max<uint32_t>(1, cap.max_send_wr));
    uint64_t sq_need = std::max<uint64_t>(sizeof(abi::SendWqe) + uint64_t(cap.max_send_sge) * sizeof(abi::Sge),
                                          sizeof(abi::SendWqe) + cap.max_inline_data);
    uint64_t sq_stride = pow2_at_least(std::max<uint64_t>(sq_need, abi::kMinWqeStride));
    uint64_t rq_entries = 0, rq_stride = 0;
    if (own_rq) {
        rq_entries = pow2_at_least(std::max<uint32_t>(1, cap.max_recv_wr));
        uint64_t rq_need = sizeof(abi::RecvWqe) + uint64_t(std::max<uint32_t>(1, cap.max_recv_sge)) * sizeof(abi::Sge);
        rq_stride = pow2_at_least(std::max<uint64_t>(rq_need, abi::kMinWqeStride));
    }
    if (sq_entries > abi::kMaxQueueEntries || rq_entries > abi::kMaxQueueEntries ||
        sq_stride > abi::kMaxWqeStride || rq_stride > abi::kMaxWqeStride) {
        delete qp;
        errno = EINVAL;
        return nullptr;
    }
    uint32_t room = uint32_t(sq_stride - sizeof(abi::SendWqe));
    qp->sq.entries = uint32_t(sq_entries);
    qp->sq.stride = uint32_t(sq_stride);
    qp->sq.max_sge = std::min<uint32_t>(room / sizeof(abi::Sge), max_sge);
    qp->sq.max_wr = uint32_t(sq_entries);
    qp->max_inline = std::min<uint32_t>(room, max_inline);
    if (own_rq) {
        qp->rq.entries = uint32_t(rq_entries);
        qp->rq.stride = uint32_t(rq_stride);
        qp->rq.max_sge = std::min<uint32_t>(uint32_t(rq_stride - sizeof(abi::RecvWqe)) / sizeof(abi::Sge), max_sge);
        qp->rq.max_wr = uint32_t(rq_entries);
    }

    qp->sq.mem = alloc_ring(ctx, abi::wq_ring_bytes(qp->sq.entries, qp->sq.stride));
    if (qp->sq.mem && own_rq) qp->rq.mem = alloc_ring(ctx, abi::wq_ring_bytes(qp->rq.entries, qp->rq.stride));
    if (!qp->sq.mem || (own_rq && !qp->rq.mem)) {
        int e = errno;
        free_ring(ctx, qp->sq.mem);
        delete qp;
        errno = e;
        return nullptr;
    }
    for (WorkQueue* wq : {&qp->sq, &qp->rq}) {
        if (!wq->mem) continue;
        wq->hdr = static_cast<abi::RingHeader*>(wq->mem);
        wq->slots = static_cast<uint8_t*>(wq->mem) + abi::wq_slots_offset();
    }
    qp->srq = srq_in ? to_srq(srq_in) : nullptr;
    qp->sq_sig_all = c.sq_sig_all != 0;

    abi::CmdCreateQpReq req{};
    req.sq_gva = reinterpret_cast<uintptr_t>(qp->sq.mem);
    req.rq_gva = reinterpret_cast<uintptr_t>(qp->rq.mem);
    req.user_handle = reinterpret_cast<uintptr_t>(&qp->vqp.qp);
    req.pd_handle = c.pd->handle;
    req.qp_type = c.type;
    req.send_cq_handle = to_cq(c.send_cq)->handle;
    req.recv_cq_handle = recv_cq ? to_cq(recv_cq)->handle : 0;
    req.srq_handle = qp->srq ? qp->srq->handle : 0;
    req.sq_entries = qp->sq.entries;
    req.sq_stride = qp->sq.stride;
    req.rq_entries = qp->rq.entries;
    req.rq_stride = qp->rq.stride;
    req.max_send_sge = qp->sq.max_sge;
    req.max_recv_sge = qp->rq.max_sge;
    req.max_inline_data = qp->max_inline;
    req.sq_sig_all = qp->sq_sig_all;
    abi::CmdCreateQpResp resp{};
    if (int rc = command(ctx, abi::CmdOp::CreateQp, &req, sizeof(req), &resp, sizeof(resp))) {
        free_ring(ctx, qp->sq.mem);
        free_ring(ctx, qp->rq.mem);
        delete qp;
        errno = rc;
        return nullptr;
    }
    cap.max_send_wr = qp->sq.max_wr;
    cap.max_send_sge = qp->sq.max_sge;
    cap.max_inline_data = qp->max_inline;
    if (own_rq) {
        cap.max_recv_wr = qp->rq.max_wr;
        cap.max_recv_sge = qp->rq.max_sge;
    } else if (xrc_send) {
        cap.max_recv_wr = cap.max_recv_sge = 0;
    }

    return publish(*qp, c, c.pd->context, recv_cq, srq_in, resp);
}

void to_abi_ah(const ibv_ah_attr& s, abi::AhAttr& a) {
    a.dlid = s.dlid;
    a.sl = s.sl;
    a.src_path_bits = s.src_path_bits;
    a.static_rate = s.static_rate;
    a.is_global = s.is_global;
    a.port_num = s.port_num;
    a.sgid_index = s.grh.sgid_index;
    std::memcpy(a.dgid, s.grh.dgid.raw, sizeof(a.dgid));
    a.flow_label = s.grh.flow_label;
    a.hop_limit = s.grh.hop_limit;
    a.traffic_class = s.grh.traffic_class;
}

void from_abi_ah(const abi::AhAttr& a, ibv_ah_attr& s) {
    s.dlid = a.dlid;
    s.sl = a.sl;
    s.src_path_bits = a.src_path_bits;
    s.static_rate = a.static_rate;
    s.is_global = a.is_global;
    s.port_num = a.port_num;
    s.grh.sgid_index = a.sgid_index;
    std::memcpy(s.grh.dgid.raw, a.dgid, sizeof(a.dgid));
    s.grh.flow_label = a.flow_label;
    s.grh.hop_limit = a.hop_limit;
    s.grh.traffic_class = a.traffic_class;
}

// An XRC_RECV QP: nothing but its domain (no PD, CQs or queues).
ibv_qp* create_xrc_recv(ibv_context* ibctx, ibv_qp_init_attr_ex* attr) {
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd || attr->xrcd->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    Context& ctx = ctx_of(ibctx);
    auto* qp = new (std::nothrow) Qp{};
    if (!qp) {
        errno = ENOMEM;
        return nullptr;
    }
    qp->ctx = &ctx;
    Xrcd* xrcd = to_xrcd(attr->xrcd);
    abi::CmdCreateQpReq req{};
    req.user_handle = reinterpret_cast<uintptr_t>(&qp->vqp.qp);
    req.qp_type = IBV_QPT_XRC_RECV;
    req.xrcd_handle = xrcd->vx.handle;
    abi::CmdCreateQpResp resp{};
    if (int rc = command(ctx, abi::CmdOp::CreateQp, &req, sizeof(req), &resp, sizeof(resp))) {
        delete qp;
        errno = rc;
        return nullptr;
    }
    attr->cap = ibv_qp_cap{};
    qp->vqp.comp_mask |= VRDMA_VERBS_QP_XRCD;
    qp->vqp.xrcd = &xrcd->vx;
    QpCreate c{};
    c.type = IBV_QPT_XRC_RECV;
    c.qp_context = attr->qp_context;
    return publish(*qp, c, ibctx, nullptr, nullptr, resp);
}

}  // namespace

ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
    return create_common(QpCreate{pd, attr->qp_type, attr->send_cq, attr->recv_cq, attr->srq, &attr->cap,
                                  attr->sq_sig_all, attr->qp_context, false, 0});
}

ibv_qp* create_qp_ex(ibv_context* ibctx, ibv_qp_init_attr_ex* attr) {
    uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                     IBV_QP_INIT_ATTR_XRCD;
    if (attr->qp_type == IBV_QPT_XRC_RECV && !(attr->comp_mask & ~known)) return create_xrc_recv(ibctx, attr);
    if ((attr->comp_mask & ~known) || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd ||
        ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    bool ex = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    uint64_t ops = ex ? attr->send_ops_flags : 0;
    uint64_t supported = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    const bool reliable = attr->qp_type == IBV_QPT_RC || attr->qp_type == IBV_QPT_XRC_SEND;
    if (reliable || attr->qp_type == IBV_QPT_UC)
        supported |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_BIND_MW |
                     IBV_QP_EX_WITH_LOCAL_INV;
    if (reliable)
        supported |= IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_SEND_WITH_INV;
    if (ops & ~supported) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    return create_common(QpCreate{attr->pd, attr->qp_type, attr->send_cq, attr->recv_cq, attr->srq, &attr->cap,
                                  attr->sq_sig_all, attr->qp_context, ex, ops});
}

int modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int attr_mask) {
    Qp* qp = to_qp(ibqp);
    abi::CmdModifyQpReq req{};
    req.qp_handle = qp->handle;
    req.attr_mask = uint32_t(attr_mask);
    abi::QpAttr& a = req.attr;
    a.qp_state = attr->qp_state;
    a.cur_qp_state = attr->cur_qp_state;
    a.path_mtu = attr->path_mtu;
    a.qkey = attr->qkey;
    a.rq_psn = attr->rq_psn;
    a.sq_psn = attr->sq_psn;
    a.dest_qp_num = attr->dest_qp_num;
    a.qp_access_flags = uint32_t(attr->qp_access_flags);
    a.max_send_wr = attr->cap.max_send_wr;
    a.max_recv_wr = attr->cap.max_recv_wr;
    a.max_send_sge = attr->cap.max_send_sge;
    a.max_recv_sge = attr->cap.max_recv_sge;
    a.max_inline_data = attr->cap.max_inline_data;
    a.pkey_index = attr->pkey_index;
    a.port_num = attr->port_num;
    a.min_rnr_timer = attr->min_rnr_timer;
    a.timeout = attr->timeout;
    a.retry_cnt = attr->retry_cnt;
    a.rnr_retry = attr->rnr_retry;
    a.max_rd_atomic = attr->max_rd_atomic;
    a.max_dest_rd_atomic = attr->max_dest_rd_atomic;
    a.sq_draining = attr->sq_draining;
    a.en_sqd_async_notify = attr->en_sqd_async_notify;
    if (attr_mask & IBV_QP_AV) to_abi_ah(attr->ah_attr, a.ah);
    if (int rc = command(*qp->ctx, abi::CmdOp::ModifyQp, &req, sizeof(req), nullptr, 0)) return rc;
    if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
        // The shim writes nothing more for the QP; what it wrote and was not
        // polled goes (an SRQ's receive completions stay: their buffers
        // belong to the SRQ's other consumers too).
        const bool receives = ibqp->srq == nullptr;
        if (ibqp->send_cq) discard_completions(*to_cq(ibqp->send_cq), ibqp->qp_num, false);
        if (ibqp->recv_cq) discard_completions(*to_cq(ibqp->recv_cq), ibqp->qp_num, receives);
    }
    return 0;
}

int query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init_attr) {
    Qp* qp = to_qp(ibqp);
    abi::CmdHandleReq req{qp->handle};
    abi::CmdQueryQpResp resp{};
    if (int rc = command(*qp->ctx, abi::CmdOp::QueryQp, &req, sizeof(req), &resp, sizeof(resp))) return rc;
    const abi::QpAttr& a = resp.attr;
    *attr = ibv_qp_attr{};
    attr->qp_state = static_cast<ibv_qp_state>(a.qp_state);
    attr->cur_qp_state = static_cast<ibv_qp_state>(a.cur_qp_state);
    attr->path_mtu = static_cast<ibv_mtu>(a.path_mtu);
    attr->path_mig_state = IBV_MIG_MIGRATED;
    attr->qkey = a.qkey;
    attr->rq_psn = a.rq_psn;
    attr->sq_psn = a.sq_psn;
    attr->dest_qp_num = a.dest_qp_num;
    attr->qp_access_flags = int(a.qp_access_flags);
    attr->cap.max_send_wr = qp->sq.max_wr;
    attr->cap.max_recv_wr = qp->srq ? 0 : qp->rq.max_wr;
    attr->cap.max_send_sge = qp->sq.max_sge;
    attr->cap.max_recv_sge = qp->srq ? 0 : qp->rq.max_sge;
    attr->cap.max_inline_data = qp->max_inline;
    from_abi_ah(a.ah, attr->ah_attr);
    attr->pkey_index = a.pkey_index;
    attr->en_sqd_async_notify = a.en_sqd_async_notify;
    attr->sq_draining = a.sq_draining;
    attr->max_rd_atomic = a.max_rd_atomic;
    attr->max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr->min_rnr_timer = a.min_rnr_timer;
    attr->port_num = a.port_num;
    attr->timeout = a.timeout;
    attr->retry_cnt = a.retry_cnt;
    attr->rnr_retry = a.rnr_retry;
    if (init_attr) {
        *init_attr = ibv_qp_init_attr{};
        init_attr->qp_context = ibqp->qp_context;
        init_attr->send_cq = ibqp->send_cq;
        init_attr->recv_cq = ibqp->recv_cq;
        init_attr->srq = ibqp->srq;
        init_attr->cap = attr->cap;
        init_attr->qp_type = ibqp->qp_type;
        init_attr->sq_sig_all = qp->sq_sig_all;
    }
    return 0;
}

int destroy_qp(ibv_qp* ibqp) {
    Qp* qp = to_qp(ibqp);
    Context& ctx = *qp->ctx;
    abi::CmdHandleReq req{qp->handle};
    abi::CmdDestroyResp resp{};
    int rc = command(ctx, abi::CmdOp::DestroyQp, &req, sizeof(req), &resp, sizeof(resp));
    if (rc && rc != EIO) return rc;
    if (rc == 0) {
        free_ring(ctx, qp->sq.mem);
        free_ring(ctx, qp->rq.mem);
    }
    bool zombie = retire_qp(ctx, *qp, rc == 0 ? &resp : nullptr);
    uint32_t handed;
    {
        std::lock_guard lock(ctx.ev_mu);
        handed = qp->async_read;
    }
    wait_acked(&ibqp->mutex, &ibqp->cond, &ibqp->events_completed, handed);
    if (zombie) {
        keep_zombie(ctx, qp);
        return 0;
    }
    pthread_mutex_destroy(&ibqp->mutex);
    pthread_cond_destroy(&ibqp->cond);
    delete qp;
    return 0;
}

}  // namespace vrdma::prov
