// Shared receive queues.
#include <algorithm>
#include <cerrno>
#include <new>

#include "context.h"
#include "events.h"
#include "objects.h"
#include "verbs.h"

namespace vrdma::prov {
namespace {

// A basic SRQ, or an XRC one (`xrcd` and `cq` set).
ibv_srq* create_common(ibv_pd* pd, ibv_srq_attr& attr, void* srq_context, ibv_xrcd* xrcd, ibv_cq* cq) {
    Context& ctx = ctx_of(pd->context);
    const abi::DeviceAttr& d = ctx.dev_attr;
    uint32_t max_sge = std::min(d.max_srq_sge, abi::kMaxSge);
    if (attr.max_wr == 0 || attr.max_wr > d.max_srq_wr || attr.max_sge > max_sge || attr.srq_limit > attr.max_wr) {
        errno = EINVAL;
        return nullptr;
    }
    uint64_t entries = 1;
    while (entries < attr.max_wr) entries <<= 1;
    uint64_t need = sizeof(abi::RecvWqe) + uint64_t(std::max<uint32_t>(1, attr.max_sge)) * sizeof(abi::Sge);
    uint64_t stride = abi::kMinWqeStride;
    while (stride < need) stride <<= 1;
    if (entries > abi::kMaxQueueEntries || stride > abi::kMaxWqeStride) {
        errno = EINVAL;
        return nullptr;
    }
    auto* srq = new (std::nothrow) Srq{};
    if (!srq) {
        errno = ENOMEM;
        return nullptr;
    }
    srq->ctx = &ctx;
    WorkQueue& rq = srq->rq;
    rq.entries = uint32_t(entries);
    rq.stride = uint32_t(stride);
    rq.max_sge = std::min<uint32_t>(uint32_t(stride - sizeof(abi::RecvWqe)) / sizeof(abi::Sge), max_sge);
    rq.max_wr = uint32_t(entries);
    rq.mem = alloc_ring(ctx, abi::wq_ring_bytes(rq.entries, rq.stride));
    if (!rq.mem) {
        int e = errno;
        delete srq;
        errno = e;
        return nullptr;
    }
    rq.hdr = static_cast<abi::RingHeader*>(rq.mem);
    rq.slots = static_cast<uint8_t*>(rq.mem) + abi::wq_slots_offset();

    abi::CmdCreateSrqReq req{};
    req.ring_gva = reinterpret_cast<uintptr_t>(rq.mem);
    req.user_handle = reinterpret_cast<uintptr_t>(&srq->vsrq.srq);
    req.pd_handle = pd->handle;
    req.entries = rq.entries;
    req.stride = rq.stride;
    req.max_sge = rq.max_sge;
    req.srq_limit = attr.srq_limit;
    req.srq_type = xrcd ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
    req.xrcd_handle = xrcd ? to_xrcd(xrcd)->vx.handle : 0;
    req.cq_handle = cq ? to_cq(cq)->handle : 0;
    abi::CmdCreateSrqResp resp{};
    if (int rc = command(ctx, abi::CmdOp::CreateSrq, &req, sizeof(req), &resp, sizeof(resp))) {
        free_ring(ctx, rq.mem);
        delete srq;
        errno = rc;
        return nullptr;
    }
    srq->handle = resp.srq_handle;
    srq->srq_limit = attr.srq_limit;
    ibv_srq& s = srq->vsrq.srq;
    s.handle = resp.srq_handle;
    // What libibverbs' ibv_create_srq fills itself; ibv_create_srq_ex
    // leaves it to the provider.
    s.context = pd->context;
    s.srq_context = srq_context;
    s.pd = pd;
    s.events_completed = 0;
    pthread_mutex_init(&s.mutex, nullptr);
    pthread_cond_init(&s.cond, nullptr);
    srq->vsrq.srq_type = xrcd ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
    srq->vsrq.srq_num = resp.srqn;
    if (xrcd) {
        srq->vsrq.xrcd = &to_xrcd(xrcd)->vx;
        srq->vsrq.cq = cq;
    }
    attr.max_wr = rq.max_wr;
    attr.max_sge = rq.max_sge;
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_srqs.insert(&s);
    return &s;
}

}  // namespace

ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* init) {
    return create_common(pd, init->attr, init->srq_context, nullptr, nullptr);
}

// Basic and XRC SRQs (tag matching is not offered: EOPNOTSUPP).
ibv_srq* create_srq_ex(ibv_context* ibctx, ibv_srq_init_attr_ex* a) {
    constexpr uint32_t kKnown =
        IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    const ibv_srq_type type = (a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? a->srq_type : IBV_SRQT_BASIC;
    if ((a->comp_mask & ~kKnown) || (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd || a->pd->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    if (type == IBV_SRQT_BASIC) return create_common(a->pd, a->attr, a->srq_context, nullptr, nullptr);
    const bool named = (a->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) && (a->comp_mask & IBV_SRQ_INIT_ATTR_CQ);
    if (!named || !a->xrcd || !a->cq || a->xrcd->context != ibctx || a->cq->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    return create_common(a->pd, a->attr, a->srq_context, a->xrcd, a->cq);
}

int get_srq_num(ibv_srq* ibsrq, uint32_t* srq_num) {
    *srq_num = to_srq(ibsrq)->vsrq.srq_num;
    return 0;
}

int modify_srq(ibv_srq* ibsrq, ibv_srq_attr* attr, int mask) {
    Srq* srq = to_srq(ibsrq);
    if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
    if ((mask & IBV_SRQ_MAX_WR) && attr->max_wr != srq->rq.max_wr) return EINVAL;  // no resizing
    abi::CmdModifySrqReq req{srq->handle, uint32_t(mask), attr->max_wr, attr->srq_limit};
    int rc = command(*srq->ctx, abi::CmdOp::ModifySrq, &req, sizeof(req), nullptr, 0);
    if (rc == 0 && (mask & IBV_SRQ_LIMIT)) srq->srq_limit = attr->srq_limit;
    return rc;
}

int query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) {
    Srq* srq = to_srq(ibsrq);
    abi::CmdHandleReq req{srq->handle};
    abi::CmdQuerySrqResp resp{};
    if (int rc = command(*srq->ctx, abi::CmdOp::QuerySrq, &req, sizeof(req), &resp, sizeof(resp))) return rc;
    attr->max_wr = resp.max_wr;
    attr->max_sge = resp.max_sge;
    attr->srq_limit = resp.srq_limit;
    return 0;
}

int destroy_srq(ibv_srq* ibsrq) {
    Srq* srq = to_srq(ibsrq);
    Context& ctx = *srq->ctx;
    abi::CmdHandleReq req{srq->handle};
    abi::CmdDestroyResp resp{};
    int rc = command(ctx, abi::CmdOp::DestroySrq, &req, sizeof(req), &resp, sizeof(resp));
    if (rc && rc != EIO) return rc;
    if (rc == 0) free_ring(ctx, srq->rq.mem);
    bool zombie = retire_srq(ctx, *srq, rc == 0 ? &resp : nullptr);
    uint32_t handed;
    {
        std::lock_guard lock(ctx.ev_mu);
        handed = srq->async_read;
    }
    wait_acked(&ibsrq->mutex, &ibsrq->cond, &ibsrq->events_completed, handed);
    if (zombie)
        keep_zombie(ctx, srq);
    else
        delete srq;
    return 0;
}

}  // namespace vrdma::prov
