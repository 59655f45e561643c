// ibv_post_send, ibv_post_recv, ibv_post_srq_recv: work requests into the
// shared rings. No system calls (beyond a kick of a sleeping shim), no
// allocation; one lock per queue.
#include "data_path.h"

#include <cerrno>

#include "on_demand.h"
#include "verbs.h"

namespace vrdma::prov {
namespace {

int build_send(Qp& qp, const ibv_send_wr& wr, uint8_t* slot) {
    ibv_qp_type type = qp.vqp.qp.qp_type;
    if (!opcode_allowed(type, wr.opcode) || wr.num_sge < 0) return EINVAL;
    abi::SendWqe w{};
    w.wr_id = wr.wr_id;
    w.opcode = wr.opcode;
    unsigned flags = wr.send_flags;
    bool inl = (flags & IBV_SEND_INLINE) && inline_allowed(wr.opcode);
    if (!inl) flags &= ~unsigned(IBV_SEND_INLINE);
    w.send_flags = flags;
    w.imm_data = wr.imm_data;
    uint8_t* payload = slot + sizeof(abi::SendWqe);
    if (is_local_op(wr.opcode)) {
        // No data: the SGE list is not read.
    } else if (inl) {
        uint64_t total = 0;
        for (int i = 0; i < wr.num_sge; ++i) total += wr.sg_list[i].length;
        if (total > qp.max_inline) return EINVAL;
        size_t off = 0;
        for (int i = 0; i < wr.num_sge; ++i) {
            const ibv_sge& s = wr.sg_list[i];
            if (s.length) std::memcpy(payload + off, reinterpret_cast<const void*>(uintptr_t(s.addr)), s.length);
            off += s.length;
        }
        w.inline_len = uint32_t(total);
        w.num_sge = 0;
    } else {
        if (uint32_t(wr.num_sge) > qp.sq.max_sge) return EINVAL;
        fault_in_sges(*qp.ctx, wr.sg_list, size_t(wr.num_sge));
        auto* sge = reinterpret_cast<abi::Sge*>(payload);
        for (int i = 0; i < wr.num_sge; ++i)
            sge[i] = abi::Sge{wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
        w.num_sge = uint32_t(wr.num_sge);
    }
    switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
        w.remote_addr = wr.wr.rdma.remote_addr;
        w.rkey = wr.wr.rdma.rkey;
        break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
        w.remote_addr = wr.wr.atomic.remote_addr;
        w.rkey = wr.wr.atomic.rkey;
        w.compare_add = wr.wr.atomic.compare_add;
        w.swap = wr.wr.atomic.swap;
        break;
    case IBV_WR_BIND_MW:
        if (!wr.bind_mw.mw || wr.bind_mw.mw->context != qp.vqp.qp.context) return EINVAL;
        fill_bind(w, *wr.bind_mw.mw, wr.bind_mw.rkey, wr.bind_mw.bind_info);
        break;
    case IBV_WR_LOCAL_INV:
    case IBV_WR_SEND_WITH_INV:
        w.rkey = wr.invalidate_rkey;
        break;
    default:
        break;
    }
    if (type == IBV_QPT_XRC_SEND) w.xrc_remote_srqn = wr.qp_type.xrc.remote_srqn;
    if (type == IBV_QPT_UD) {
        if (!wr.wr.ud.ah) return EINVAL;
        w.ah_handle = to_ah(wr.wr.ud.ah)->handle;
        w.remote_qpn = wr.wr.ud.remote_qpn;
        w.remote_qkey = wr.wr.ud.remote_qkey;
    }
    std::memcpy(slot, &w, sizeof(w));
    return 0;
}

int post_to_rq(Context& ctx, WorkQueue& rq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    std::lock_guard lock(rq.mu);
    uint32_t prod = rq.prod;
    uint32_t cons = rq.cons_seen;
    int rc = 0;
    bool posted = false;
    for (; wr; wr = wr->next) {
        if (wr->num_sge < 0 || uint32_t(wr->num_sge) > rq.max_sge) {
            rc = EINVAL;
            break;
        }
        if (!wq_has_room(rq, prod, &cons)) {
            rc = ENOMEM;
            break;
        }
        uint8_t* slot = rq.slot(prod);
        abi::RecvWqe h{wr->wr_id, uint32_t(wr->num_sge), 0};
        std::memcpy(slot, &h, sizeof(h));
        // Lkeys are not checked here: the shim does at execution (Open MPI
        // probes SRQ support with an unregistered buffer).
        fault_in_sges(ctx, wr->sg_list, size_t(wr->num_sge));
        auto* sge = reinterpret_cast<abi::Sge*>(slot + sizeof(abi::RecvWqe));
        for (int i = 0; i < wr->num_sge; ++i)
            sge[i] = abi::Sge{wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
        prod = ring_next(prod, rq.entries);
        posted = true;
    }
    if (posted) wq_publish(ctx, rq, prod);
    if (rc) *bad = wr;
    return rc;
}

}  // namespace

int post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
    Qp* qp = to_qp(ibqp);
    Context& ctx = *qp->ctx;
    if (ctx.dead.load(std::memory_order_relaxed)) {
        *bad = wr;
        return EIO;
    }
    if (!send_state_ok(ibqp->state) || !qp->sq.mem) {  // an XRC_RECV QP has no send queue
        *bad = wr;
        return EINVAL;
    }
    WorkQueue& sq = qp->sq;
    std::lock_guard lock(sq.mu);
    uint32_t prod = sq.prod;
    uint32_t cons = sq.cons_seen;
    int rc = 0;
    bool posted = false;
    for (; wr; wr = wr->next) {
        if (!wq_has_room(sq, prod, &cons)) {
            rc = ENOMEM;
            break;
        }
        rc = build_send(*qp, *wr, sq.slot(prod));
        if (rc) break;
        prod = ring_next(prod, sq.entries);
        posted = true;
    }
    if (posted) wq_publish(ctx, sq, prod);
    if (rc) *bad = wr;
    return rc;
}

int post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    Qp* qp = to_qp(ibqp);
    Context& ctx = *qp->ctx;
    if (ctx.dead.load(std::memory_order_relaxed)) {
        *bad = wr;
        return EIO;
    }
    if (qp->srq || !qp->rq.mem || ibqp->state == IBV_QPS_RESET) {
        *bad = wr;
        return EINVAL;
    }
    return post_to_rq(ctx, qp->rq, wr, bad);
}

int post_srq_recv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    Srq* srq = to_srq(ibsrq);
    Context& ctx = *srq->ctx;
    if (ctx.dead.load(std::memory_order_relaxed)) {
        *bad = wr;
        return EIO;
    }
    return post_to_rq(ctx, srq->rq, wr, bad);
}

}  // namespace vrdma::prov
