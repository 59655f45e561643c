// The ibv_qp_ex work-request API (ibv_wr_start ... ibv_wr_complete), used by
// perftest and newer applications. Same ring, same rules as ibv_post_send:
// WQEs are built in place between wr_start and wr_complete and published
// together; any error makes wr_complete discard the whole batch.
#include <cerrno>
#include <cstring>

#include "data_path.h"
#include "on_demand.h"
#include "verbs.h"

namespace vrdma::prov {
namespace {

Qp* qp_of(ibv_qp_ex* qpx) { return reinterpret_cast<Qp*>(qpx); }

abi::SendWqe* cur(Qp* qp) { return reinterpret_cast<abi::SendWqe*>(qp->wr_cur); }

// Opens the next WQE of the batch. nullptr (and wr_err set) on failure.
abi::SendWqe* begin(ibv_qp_ex* qpx, ibv_wr_opcode op) {
    Qp* qp = qp_of(qpx);
    qp->wr_cur = nullptr;
    if (qp->wr_err) return nullptr;
    // Atomic write exists only here: ibv_send_wr has no field for its value.
    const ibv_qp_type type = qp->vqp.qp.qp_type;
    const bool reliable = type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND;
    if (op == IBV_WR_ATOMIC_WRITE ? !reliable : !opcode_allowed(type, op)) {
        qp->wr_err = EINVAL;
        return nullptr;
    }
    if (!wq_has_room(qp->sq, qp->wr_prod, &qp->wr_cons)) {
        qp->wr_err = ENOMEM;
        return nullptr;
    }
    uint8_t* slot = qp->sq.slot(qp->wr_prod);
    qp->wr_prod = ring_next(qp->wr_prod, qp->sq.entries);
    auto* w = reinterpret_cast<abi::SendWqe*>(slot);
    *w = abi::SendWqe{};
    w->wr_id = qpx->wr_id;
    w->opcode = op;
    w->send_flags = qpx->wr_flags & ~unsigned(IBV_SEND_INLINE);
    qp->wr_cur = slot;
    return w;
}

void wr_start(ibv_qp_ex* qpx) {
    Qp* qp = qp_of(qpx);
    qp->sq.mu.lock();
    qp->wr_prod = qp->sq.prod;
    qp->wr_cons = qp->sq.cons_seen;
    qp->wr_cur = nullptr;
    qp->wr_err = 0;
    if (qp->ctx->dead.load(std::memory_order_relaxed)) qp->wr_err = EIO;
    else if (!send_state_ok(qpx->qp_base.state)) qp->wr_err = EINVAL;
}

int wr_complete(ibv_qp_ex* qpx) {
    Qp* qp = qp_of(qpx);
    int rc = qp->wr_err;
    if (!rc && qp->wr_prod != qp->sq.prod) wq_publish(*qp->ctx, qp->sq, qp->wr_prod);
    qp->wr_cur = nullptr;
    qp->sq.mu.unlock();
    return rc;
}

void wr_abort(ibv_qp_ex* qpx) {
    Qp* qp = qp_of(qpx);
    qp->wr_cur = nullptr;
    qp->sq.mu.unlock();
}

void wr_send(ibv_qp_ex* qpx) { begin(qpx, IBV_WR_SEND); }

void wr_send_imm(ibv_qp_ex* qpx, __be32 imm) {
    if (auto* w = begin(qpx, IBV_WR_SEND_WITH_IMM)) w->imm_data = imm;
}

void wr_rdma_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr) {
    if (auto* w = begin(qpx, IBV_WR_RDMA_WRITE)) {
        w->rkey = rkey;
        w->remote_addr = addr;
    }
}

void wr_rdma_write_imm(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, __be32 imm) {
    if (auto* w = begin(qpx, IBV_WR_RDMA_WRITE_WITH_IMM)) {
        w->rkey = rkey;
        w->remote_addr = addr;
        w->imm_data = imm;
    }
}

void wr_rdma_read(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr) {
    if (auto* w = begin(qpx, IBV_WR_RDMA_READ)) {
        w->rkey = rkey;
        w->remote_addr = addr;
    }
}

void wr_atomic_cmp_swp(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
    if (auto* w = begin(qpx, IBV_WR_ATOMIC_CMP_AND_SWP)) {
        w->rkey = rkey;
        w->remote_addr = addr;
        w->compare_add = compare;
        w->swap = swap;
    }
}

void wr_atomic_fetch_add(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t add) {
    if (auto* w = begin(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD)) {
        w->rkey = rkey;
        w->remote_addr = addr;
        w->compare_add = add;
    }
}

// The 8 bytes travel in the WQE (compare_add) and are stored at the target
// by one 8-byte store; no SGE is read.
void wr_atomic_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, const void* atomic_wr) {
    if (auto* w = begin(qpx, IBV_WR_ATOMIC_WRITE)) {
        w->rkey = rkey;
        w->remote_addr = addr;
        std::memcpy(&w->compare_add, atomic_wr, sizeof(w->compare_add));
    }
}

void wr_bind_mw(ibv_qp_ex* qpx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
    Qp* qp = qp_of(qpx);
    if (!mw || !info || mw->context != qpx->qp_base.context) {
        if (!qp->wr_err) qp->wr_err = EINVAL;
        return;
    }
    if (auto* w = begin(qpx, IBV_WR_BIND_MW)) fill_bind(*w, *mw, rkey, *info);
}

void wr_local_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
    if (auto* w = begin(qpx, IBV_WR_LOCAL_INV)) w->rkey = invalidate_rkey;
}

void wr_send_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
    if (auto* w = begin(qpx, IBV_WR_SEND_WITH_INV)) w->rkey = invalidate_rkey;
}

void wr_set_ud_addr(ibv_qp_ex* qpx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
    Qp* qp = qp_of(qpx);
    auto* w = cur(qp);
    if (!w) return;
    if (!ah) {
        qp->wr_err = EINVAL;
        return;
    }
    w->ah_handle = to_ah(ah)->handle;
    w->remote_qpn = remote_qpn;
    w->remote_qkey = remote_qkey;
}

void wr_set_sge_list(ibv_qp_ex* qpx, size_t num_sge, const ibv_sge* list) {
    Qp* qp = qp_of(qpx);
    auto* w = cur(qp);
    if (!w) return;
    if (num_sge > qp->sq.max_sge || is_local_op(static_cast<ibv_wr_opcode>(w->opcode))) {
        qp->wr_err = EINVAL;
        return;
    }
    fault_in_sges(*qp->ctx, list, num_sge);
    auto* sge = reinterpret_cast<abi::Sge*>(qp->wr_cur + sizeof(abi::SendWqe));
    for (size_t i = 0; i < num_sge; ++i) sge[i] = abi::Sge{list[i].addr, list[i].length, list[i].lkey};
    w->num_sge = uint32_t(num_sge);
    w->inline_len = 0;
    w->send_flags &= ~unsigned(IBV_SEND_INLINE);
}

void wr_set_xrc_srqn(ibv_qp_ex* qpx, uint32_t remote_srqn) {
    if (auto* w = cur(qp_of(qpx))) w->xrc_remote_srqn = remote_srqn;
}

void wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
    ibv_sge s{addr, length, lkey};
    wr_set_sge_list(qpx, 1, &s);
}

void wr_set_inline_data_list(ibv_qp_ex* qpx, size_t num_buf, const ibv_data_buf* bufs) {
    Qp* qp = qp_of(qpx);
    auto* w = cur(qp);
    if (!w) return;
    if (!inline_allowed(static_cast<ibv_wr_opcode>(w->opcode))) {
        qp->wr_err = EINVAL;
        return;
    }
    size_t total = 0;
    for (size_t i = 0; i < num_buf; ++i) total += bufs[i].length;
    if (total > qp->max_inline) {
        qp->wr_err = EINVAL;
        return;
    }
    uint8_t* dst = qp->wr_cur + sizeof(abi::SendWqe);
    for (size_t i = 0; i < num_buf; ++i) {
        if (bufs[i].length) std::memcpy(dst, bufs[i].addr, bufs[i].length);
        dst += bufs[i].length;
    }
    w->num_sge = 0;
    w->inline_len = uint32_t(total);
    w->send_flags |= IBV_SEND_INLINE;
}

void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
    ibv_data_buf b{addr, length};
    wr_set_inline_data_list(qpx, 1, &b);
}

}  // namespace

void install_qp_ex_ops(Qp& qp, uint64_t ops) {
    ibv_qp_ex& x = qp.vqp.qp_ex;
    x.wr_start = wr_start;
    x.wr_complete = wr_complete;
    x.wr_abort = wr_abort;
    x.wr_set_sge = wr_set_sge;
    x.wr_set_sge_list = wr_set_sge_list;
    x.wr_set_inline_data = wr_set_inline_data;
    x.wr_set_inline_data_list = wr_set_inline_data_list;
    if (qp.vqp.qp.qp_type == IBV_QPT_UD) x.wr_set_ud_addr = wr_set_ud_addr;
    if (qp.vqp.qp.qp_type == IBV_QPT_XRC_SEND) x.wr_set_xrc_srqn = wr_set_xrc_srqn;
    if (ops & IBV_QP_EX_WITH_SEND) x.wr_send = wr_send;
    if (ops & IBV_QP_EX_WITH_SEND_WITH_IMM) x.wr_send_imm = wr_send_imm;
    if (ops & IBV_QP_EX_WITH_RDMA_WRITE) x.wr_rdma_write = wr_rdma_write;
    if (ops & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) x.wr_rdma_write_imm = wr_rdma_write_imm;
    if (ops & IBV_QP_EX_WITH_RDMA_READ) x.wr_rdma_read = wr_rdma_read;
    if (ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
    if (ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) x.wr_atomic_fetch_add = wr_atomic_fetch_add;
    if (ops & IBV_QP_EX_WITH_ATOMIC_WRITE) x.wr_atomic_write = wr_atomic_write;
    if (ops & IBV_QP_EX_WITH_BIND_MW) x.wr_bind_mw = wr_bind_mw;
    if (ops & IBV_QP_EX_WITH_LOCAL_INV) x.wr_local_inv = wr_local_inv;
    if (ops & IBV_QP_EX_WITH_SEND_WITH_INV) x.wr_send_inv = wr_send_inv;
}

}  // namespace vrdma::prov
