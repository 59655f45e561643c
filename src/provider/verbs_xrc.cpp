// XRC: domains (ibv_open_xrcd), and the receiving QP of a domain
// (IBV_QPT_XRC_RECV), which has no queues, CQs or PD of its own: each
// message names the XRC SRQ it goes to (docs/protocol.md "XRC").
#include <sys/stat.h>

#include <cerrno>
#include <fcntl.h>
#include <mutex>
#include <new>

#include "context.h"
#include "events.h"
#include "objects.h"
#include "verbs.h"

namespace vrdma::prov {

// As the kernel's: with a file, the domain opened on that file before is
// shared (O_EXCL refuses it; without O_CREAT it must exist); without one,
// a new domain. Domains are this context's own (another context or
// process opening the same file gets a domain of its own).
ibv_xrcd* open_xrcd(ibv_context* ibctx, ibv_xrcd_init_attr* attr) {
    Context& ctx = ctx_of(ibctx);
    constexpr uint32_t kKnown = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if ((attr->comp_mask & ~kKnown) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ||
        (attr->oflags & ~(O_CREAT | O_EXCL))) {
        errno = EINVAL;
        return nullptr;
    }
    const bool has_file = (attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) && attr->fd != -1;
    struct stat st {};
    if (has_file && fstat(attr->fd, &st) != 0) {
        errno = EBADF;
        return nullptr;
    }
    std::lock_guard lock(ctx.mem_mu);
    if (has_file) {
        for (Xrcd* x : ctx.xrcds) {
            if (!x->has_file || x->dev != st.st_dev || x->ino != st.st_ino) continue;
            if (attr->oflags & O_EXCL) {
                errno = EINVAL;
                return nullptr;
            }
            ++x->opens;
            return &x->vx.xrcd;
        }
        if (!(attr->oflags & O_CREAT)) {
            errno = EINVAL;
            return nullptr;
        }
    }
    auto* x = new (std::nothrow) Xrcd{};
    if (!x) {
        errno = ENOMEM;
        return nullptr;
    }
    abi::CmdOpenXrcdResp resp{};
    if (int rc = command(ctx, abi::CmdOp::OpenXrcd, nullptr, 0, &resp, sizeof(resp))) {
        delete x;
        errno = rc;
        return nullptr;
    }
    x->vx.xrcd.context = ibctx;
    x->vx.handle = resp.xrcd_handle;
    x->handle = resp.xrcd_handle;
    x->has_file = has_file;
    x->dev = st.st_dev;
    x->ino = st.st_ino;
    x->opens = 1;
    ctx.xrcds.push_back(x);
    return &x->vx.xrcd;
}

int close_xrcd(ibv_xrcd* ibx) {
    Xrcd* x = to_xrcd(ibx);
    Context& ctx = ctx_of(ibx->context);
    std::lock_guard lock(ctx.mem_mu);
    if (x->opens > 1) {
        --x->opens;
        return 0;
    }
    abi::CmdHandleReq req{x->handle};
    int rc = command(ctx, abi::CmdOp::CloseXrcd, &req, sizeof(req), nullptr, 0);
    if (rc && rc != EIO) return rc;  // EBUSY: QPs or SRQs are in it
    std::erase(ctx.xrcds, x);
    delete x;
    return 0;
}

ibv_qp* create_xrc_recv_qp(ibv_context* ibctx, ibv_qp_init_attr_ex* attr) {
    Context& ctx = ctx_of(ibctx);
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd || attr->xrcd->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    auto* qp = new (std::nothrow) Qp{};
    if (!qp) {
        errno = ENOMEM;
        return nullptr;
    }
    qp->ctx = &ctx;
    abi::CmdCreateQpReq req{};
    req.user_handle = reinterpret_cast<uintptr_t>(&qp->vqp.qp);
    req.qp_type = IBV_QPT_XRC_RECV;
    req.xrcd_handle = to_xrcd(attr->xrcd)->handle;
    abi::CmdCreateQpResp resp{};
    if (int rc = command(ctx, abi::CmdOp::CreateQp, &req, sizeof(req), &resp, sizeof(resp))) {
        delete qp;
        errno = rc;
        return nullptr;
    }
    qp->handle = resp.qp_handle;
    qp->sq.work_slot = qp->rq.work_slot = abi::kNoWorkSlot;
    attr->cap = ibv_qp_cap{};
    ibv_qp& q = qp->vqp.qp;
    q.context = ibctx;
    q.qp_context = attr->qp_context;
    q.handle = resp.qp_handle;
    q.qp_num = resp.qpn;
    q.state = IBV_QPS_RESET;
    q.qp_type = IBV_QPT_XRC_RECV;
    pthread_mutex_init(&q.mutex, nullptr);
    pthread_cond_init(&q.cond, nullptr);
    q.events_completed = 0;
    qp->vqp.comp_mask |= VRDMA_VERBS_QP_XRCD;
    qp->vqp.xrcd = &to_xrcd(attr->xrcd)->vx;
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_qps.insert(&q);
    return &q;
}

}  // namespace vrdma::prov
