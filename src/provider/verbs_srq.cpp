// Shared receive queues.
#include <algorithm>
#include <cerrno>
#include <new>

#include "context.h"
#include "events.h"
#include "objects.h"
#include "verbs.h"

namespace vrdma::prov {

ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* init) {
    Context& ctx = ctx_of(pd->context);
    const abi::DeviceAttr& d = ctx.dev_attr;
    ibv_srq_attr& attr = init->attr;
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
    abi::CmdCreateSrqResp resp{};
    if (int rc = command(ctx, abi::CmdOp::CreateSrq, &req, sizeof(req), &resp, sizeof(resp))) {
        free_ring(ctx, rq.mem);
        delete srq;
        errno = rc;
        return nullptr;
    }
    srq->handle = resp.srq_handle;
    srq->srq_limit = attr.srq_limit;
    srq->vsrq.srq.handle = resp.srq_handle;
    srq->vsrq.srq_type = IBV_SRQT_BASIC;
    srq->vsrq.srq_num = resp.srqn;
    attr.max_wr = rq.max_wr;
    attr.max_sge = rq.max_sge;
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_srqs.insert(&srq->vsrq.srq);
    return &srq->vsrq.srq;
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
