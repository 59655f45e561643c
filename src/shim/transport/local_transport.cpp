#include "local_transport.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cstring>

#include "async_events.h"
#include "cq_writer.h"
#include "qp_state.h"

namespace vrdma::shim {
namespace {

// What the responder's receive queue offers.
struct RecvSlot {
    WorkQueue* wq = nullptr;
    Srq* srq = nullptr;
    uint32_t max_sge = 0;
};

bool responder_ready(uint32_t state) {
    return state == IBV_QPS_RTR || state == IBV_QPS_RTS || state == IBV_QPS_SQD;
}

RecvSlot recv_queue_of(Context& rctx, Qp& rqp) {
    RecvSlot r;
    if (rqp.srq) {
        r.srq = rctx.srqs.get(rqp.srq);
        if (r.srq) {
            r.wq = &r.srq->wq;
            r.max_sge = r.srq->max_sge;
        }
    } else {
        r.wq = &rqp.rq;
        r.max_sge = rqp.max_recv_sge;
    }
    return r;
}

// True if a receive WQE is posted. An invalid producer index puts the
// responder QP in error (and reads as "nothing posted").
bool recv_available(Context& rctx, Qp& rqp, RecvSlot& rs) {
    rs = recv_queue_of(rctx, rqp);
    if (!rs.wq) return false;
    uint32_t n;
    if (!wq_pending(*rs.wq, n)) {
        qp_set_error(rctx, rqp, IBV_EVENT_QP_FATAL);
        return false;
    }
    return n > 0;
}

void consume_recv(Context& rctx, RecvSlot& rs) {
    wq_consume(*rs.wq);
    if (rs.srq && rs.srq->limit) {
        uint32_t left;
        if (wq_pending(*rs.wq, left) && left < rs.srq->limit) {
            rs.srq->limit = 0;  // one event per arming
            post_srq_event(rctx, *rs.srq, IBV_EVENT_SRQ_LIMIT_REACHED);
        }
    }
}

void complete_recv(Context& rctx, Qp& rqp, uint64_t wr_id, uint32_t status, uint32_t opcode, uint32_t byte_len,
                   const abi::SendWqe* hdr, const Context& sctx, const Qp& sqp, uint8_t sl, bool grh) {
    abi::Cqe c{};
    c.wr_id = wr_id;
    c.status = status;
    c.opcode = opcode;
    c.byte_len = byte_len;
    c.qp_num = rqp.qpn;
    c.src_qp = sqp.qpn;
    c.slid = sctx.guest().lid;
    c.sl = sl;
    c.pkey_index = 0;
    if (hdr && status == IBV_WC_SUCCESS &&
        (hdr->opcode == IBV_WR_SEND_WITH_IMM || hdr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)) {
        c.imm_data = hdr->imm_data;
        c.wc_flags |= IBV_WC_WITH_IMM;
    }
    if (grh) c.wc_flags |= IBV_WC_GRH;
    cq_push(rctx, rqp.recv_cq, c, hdr && (hdr->send_flags & IBV_SEND_SOLICITED));
}

// Arms (or re-arms) the QP's timer for the current WQE. Returns false when
// the retries are exhausted. An RNR NAK arrives at once, so each one uses a
// retry (rnr_retry 7: forever); a lost request is noticed only when its
// timer expires, so the first timer is free and retry_cnt more follow.
bool arm_wait(Engine& eng, Context& ctx, Qp& qp, SqWait kind, uint32_t budget, uint64_t delay_ns) {
    bool fresh = qp.wait != kind;
    if (fresh) {
        qp.wait = kind;
        qp.retries_left = budget;
    }
    bool infinite = kind == SqWait::Rnr && budget == 7;
    if (!infinite && (kind == SqWait::Rnr || !fresh)) {
        if (qp.retries_left == 0) {
            qp.wait = SqWait::None;
            return false;
        }
        --qp.retries_left;
    }
    qp.deadline_ns = eng.now() + delay_ns;
    if (ctx.next_deadline_ns == 0 || qp.deadline_ns < ctx.next_deadline_ns) ctx.next_deadline_ns = qp.deadline_ns;
    return true;
}

ExecResult fail_rc(Context& ctx, Qp& qp, const abi::SendWqe& hdr, uint32_t status) {
    complete_send(qp, hdr, status, 0);
    qp_set_error(ctx, qp, -1);
    return ExecResult::Done;
}

// The 40-byte GRH written in front of a UD payload from a global AH.
void write_grh(uint8_t* out40, const Context& sctx, const abi::AhAttr& ah, uint32_t payload) {
    uint8_t g[40] = {};
    uint32_t ver = htonl((6u << 28) | (uint32_t(ah.traffic_class) << 20) | (ah.flow_label & 0xfffff));
    std::memcpy(g, &ver, 4);
    uint16_t plen = htons(uint16_t(payload));
    std::memcpy(g + 4, &plen, 2);
    g[6] = 0x1b;  // next header: IBA transport
    g[7] = ah.hop_limit;
    make_gid(sctx.guest().guid, g + 8);
    std::memcpy(g + 24, ah.dgid, 16);
    std::memcpy(out40, g, 40);
}

ExecResult execute_ud(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t status) {
    const abi::SendWqe& h = w.hdr;
    auto fail = [&](uint32_t st) {
        complete_send(qp, h, st, 0);
        qp_set_sq_error(ctx, qp);
        return ExecResult::Done;
    };
    if (status != IBV_WC_SUCCESS) return fail(status);
    if (h.opcode != IBV_WR_SEND && h.opcode != IBV_WR_SEND_WITH_IMM) return fail(IBV_WC_LOC_QP_OP_ERR);
    const Ah* ah = ctx.ahs.get(h.ah_handle);
    if (!ah || ah->pd != qp.pd) return fail(IBV_WC_LOC_QP_OP_ERR);
    Span src[abi::kMaxSge];
    uint32_t ns = 0;
    uint64_t len = 0;
    if (w.is_inline) {
        src[0] = Span{w.inline_data, w.inline_len};
        ns = w.inline_len ? 1 : 0;
        len = w.inline_len;
    } else {
        uint32_t st = resolve_sges(ctx, qp.pd, w.sge, w.num_sge, 0, src, ns, len);
        if (st != IBV_WC_SUCCESS) return fail(st);
    }
    if (len > kPortMtuBytes) return fail(IBV_WC_LOC_LEN_ERR);

    // Deliver, or drop silently like a lost datagram.
    Engine::QpRef dst = eng.find_qp(ah->attr.dlid, h.remote_qpn);
    uint32_t qkey = (h.remote_qkey & 0x80000000u) ? qp.attr.qkey : h.remote_qkey;
    RecvSlot rs;
    if (dst && dst.qp->type == IBV_QPT_UD && responder_ready(dst.qp->state) && dst.qp->attr.qkey == qkey &&
        ctx.guest().port_active && dst.ctx->guest().port_active && recv_available(*dst.ctx, *dst.qp, rs)) {
        RecvWork rw;
        uint32_t rst = read_recv_wqe(*rs.wq, rs.wq->cons, rs.max_sge, rw);
        Span dsp[abi::kMaxSge];
        uint32_t nd = 0;
        uint64_t cap = 0;
        if (rst == IBV_WC_SUCCESS)
            rst = resolve_sges(*dst.ctx, dst.qp->pd, rw.sge, rw.num_sge, IBV_ACCESS_LOCAL_WRITE, dsp, nd, cap);
        if (rst == IBV_WC_SUCCESS && cap < abi::kUdGrhBytes + len) rst = IBV_WC_LOC_LEN_ERR;
        bool grh = ah->attr.is_global != 0;
        if (rst == IBV_WC_SUCCESS) {
            if (grh) {
                uint8_t g[40];
                write_grh(g, ctx, ah->attr, uint32_t(len));
                Span gs{g, 40};
                copy_sg(dsp, nd, 0, &gs, 1, 40);
            }
            copy_sg(dsp, nd, abi::kUdGrhBytes, src, ns, len);
        }
        consume_recv(*dst.ctx, rs);
        complete_recv(*dst.ctx, *dst.qp, rw.wr_id, rst, IBV_WC_RECV, uint32_t(abi::kUdGrhBytes + len), &h, ctx, qp,
                      ah->attr.sl, grh && rst == IBV_WC_SUCCESS);
    }
    complete_send(qp, h, IBV_WC_SUCCESS, uint32_t(len));
    return ExecResult::Done;
}

ExecResult execute_rc(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t status) {
    const abi::SendWqe& h = w.hdr;
    if (status != IBV_WC_SUCCESS) return fail_rc(ctx, qp, h, status);
    const uint32_t op = h.opcode;
    const bool is_send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
    const bool is_write = op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    const bool is_read = op == IBV_WR_RDMA_READ;
    const bool is_atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
    if (!is_send && !is_write && !is_read && !is_atomic) return fail_rc(ctx, qp, h, IBV_WC_LOC_QP_OP_ERR);
    if (w.is_inline && (is_read || is_atomic)) return fail_rc(ctx, qp, h, IBV_WC_LOC_QP_OP_ERR);

    // Local buffers: the shim writes into them for READ and atomics.
    Span loc[abi::kMaxSge];
    uint32_t nl = 0;
    uint64_t len = 0;
    if (w.is_inline) {
        loc[0] = Span{w.inline_data, w.inline_len};
        nl = w.inline_len ? 1 : 0;
        len = w.inline_len;
    } else {
        uint32_t need = (is_read || is_atomic) ? IBV_ACCESS_LOCAL_WRITE : 0;
        uint32_t st = resolve_sges(ctx, qp.pd, w.sge, w.num_sge, need, loc, nl, len);
        if (st != IBV_WC_SUCCESS) return fail_rc(ctx, qp, h, st);
    }
    if (is_atomic && len != 8) return fail_rc(ctx, qp, h, IBV_WC_LOC_LEN_ERR);

    // The responder: connected back to us and able to receive; otherwise the
    // request is lost and retried until retry_cnt is exhausted.
    Engine::QpRef peer = eng.find_qp(qp.attr.ah.dlid, qp.attr.dest_qp_num);
    bool reachable = peer && peer.qp->type == IBV_QPT_RC && responder_ready(peer.qp->state) &&
                     peer.qp->attr.dest_qp_num == qp.qpn && peer.qp->attr.ah.dlid == ctx.guest().lid &&
                     ctx.guest().port_active && peer.ctx->guest().port_active;
    if (!reachable) {
        if (arm_wait(eng, ctx, qp, SqWait::Retry, qp.attr.retry_cnt, ack_timeout_ns(qp.attr.timeout)))
            return ExecResult::Wait;
        return fail_rc(ctx, qp, h, IBV_WC_RETRY_EXC_ERR);
    }
    Context& rctx = *peer.ctx;
    Qp& rqp = *peer.qp;
    qp_request_arrived(rctx, rqp);

    // Receive WQE first for operations that consume one: no data moves
    // before an RNR.
    RecvSlot rs;
    const bool consumes = is_send || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (consumes && !recv_available(rctx, rqp, rs)) {
        if (rqp.state == IBV_QPS_ERR) {  // the responder just failed: lost request
            if (arm_wait(eng, ctx, qp, SqWait::Retry, qp.attr.retry_cnt, ack_timeout_ns(qp.attr.timeout)))
                return ExecResult::Wait;
            return fail_rc(ctx, qp, h, IBV_WC_RETRY_EXC_ERR);
        }
        if (arm_wait(eng, ctx, qp, SqWait::Rnr, qp.attr.rnr_retry, rnr_timer_ns(rqp.attr.min_rnr_timer)))
            return ExecResult::Wait;
        return fail_rc(ctx, qp, h, IBV_WC_RNR_RETRY_EXC_ERR);
    }
    qp.wait = SqWait::None;

    // Both sides fail: the requester with `req_status`, the responder's
    // receive (if one was taken) with `resp_status`.
    auto fail_both = [&](uint32_t req_status, int resp_event) {
        complete_send(qp, h, req_status, 0);
        qp_set_error(ctx, qp, -1);
        qp_set_error(rctx, rqp, resp_event);
        return ExecResult::Done;
    };

    if (is_send) {
        RecvWork rw;
        uint32_t rst = read_recv_wqe(*rs.wq, rs.wq->cons, rs.max_sge, rw);
        Span dst[abi::kMaxSge];
        uint32_t nd = 0;
        uint64_t cap = 0;
        if (rst == IBV_WC_SUCCESS)
            rst = resolve_sges(rctx, rqp.pd, rw.sge, rw.num_sge, IBV_ACCESS_LOCAL_WRITE, dst, nd, cap);
        if (rst != IBV_WC_SUCCESS) {
            consume_recv(rctx, rs);
            complete_recv(rctx, rqp, rw.wr_id, rst, IBV_WC_RECV, 0, nullptr, ctx, qp, 0, false);
            return fail_both(IBV_WC_REM_OP_ERR, IBV_EVENT_QP_FATAL);
        }
        if (cap < len) {
            consume_recv(rctx, rs);
            complete_recv(rctx, rqp, rw.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, nullptr, ctx, qp, 0, false);
            return fail_both(IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
        }
        copy_sg(dst, nd, 0, loc, nl, len);
        consume_recv(rctx, rs);
        complete_recv(rctx, rqp, rw.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(len), &h, ctx, qp,
                      qp.attr.ah.sl, false);
        complete_send(qp, h, IBV_WC_SUCCESS, uint32_t(len));
        return ExecResult::Done;
    }

    // RDMA and atomics: rkey of the responder's context, in the responder
    // QP's PD, with the access the QP and the MR both grant.
    uint32_t need = is_write ? IBV_ACCESS_REMOTE_WRITE
                             : is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_ATOMIC;
    if (is_atomic && (h.remote_addr & 7)) return fail_both(IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
    uint8_t* remote = nullptr;
    if (len > 0) {
        if ((rqp.attr.qp_access_flags & need) != need) return fail_both(IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
        remote = resolve_rkey(rctx, rqp.pd, h.rkey, h.remote_addr, len, need);
        if (!remote) return fail_both(IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
    }
    if (is_write) {
        Span r{remote, len};
        if (len) copy_sg(&r, 1, 0, loc, nl, len);
        if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            RecvWork rw;
            uint32_t rst = read_recv_wqe(*rs.wq, rs.wq->cons, rs.max_sge, rw);
            consume_recv(rctx, rs);
            if (rst != IBV_WC_SUCCESS) {
                complete_recv(rctx, rqp, rw.wr_id, rst, IBV_WC_RECV_RDMA_WITH_IMM, 0, nullptr, ctx, qp, 0, false);
                return fail_both(IBV_WC_REM_OP_ERR, IBV_EVENT_QP_FATAL);
            }
            complete_recv(rctx, rqp, rw.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, uint32_t(len), &h, ctx,
                          qp, qp.attr.ah.sl, false);
        }
    } else if (is_read) {
        Span r{remote, len};
        if (len) copy_sg(loc, nl, 0, &r, 1, len);
    } else {
        auto* target = reinterpret_cast<uint64_t*>(remote);
        uint64_t old;
        if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
            old = __atomic_fetch_add(target, h.compare_add, __ATOMIC_SEQ_CST);
        } else {
            old = h.compare_add;
            __atomic_compare_exchange_n(target, &old, h.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        }
        Span o{reinterpret_cast<uint8_t*>(&old), 8};
        copy_sg(loc, nl, 0, &o, 1, 8);
    }
    complete_send(qp, h, IBV_WC_SUCCESS, uint32_t(len));
    return ExecResult::Done;
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
    default:
        return IBV_WC_SEND;
    }
}

void complete_send(Qp& qp, const abi::SendWqe& hdr, uint32_t status, uint32_t byte_len) {
    bool signaled = qp.sig_all || (hdr.send_flags & IBV_SEND_SIGNALED);
    if (status == IBV_WC_SUCCESS && !signaled) return;
    abi::Cqe c{};
    c.wr_id = hdr.wr_id;
    c.status = status;
    c.opcode = wc_opcode_for(hdr.opcode);
    c.byte_len = byte_len;
    c.qp_num = qp.qpn;
    qp.send_cqe = c;
    qp.send_cqe_pending = true;
}

ExecResult execute_send(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t status) {
    return qp.type == IBV_QPT_UD ? execute_ud(eng, ctx, qp, w, status) : execute_rc(eng, ctx, qp, w, status);
}

}  // namespace vrdma::shim
