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

// What kind of SRQ create_common makes: basic; XRC (`xrcd` and `cq`); tag
// matching (`cq` and `max_num_tags`).
struct SrqKind {
    ibv_srq_type type = IBV_SRQT_BASIC;
    ibv_xrcd* xrcd = nullptr;
    ibv_cq* cq = nullptr;
    uint32_t max_num_tags = 0;
};

ibv_srq* create_common(ibv_pd* pd, ibv_srq_attr& attr, void* srq_context, const SrqKind& kind) {
    ibv_xrcd* xrcd = kind.xrcd;
    ibv_cq* cq = kind.cq;
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
    req.srq_type = kind.type;
    req.xrcd_handle = xrcd ? to_xrcd(xrcd)->vx.handle : 0;
    req.cq_handle = cq ? to_cq(cq)->handle : 0;
    req.max_num_tags = kind.max_num_tags;
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
    srq->vsrq.srq_type = kind.type;
    srq->vsrq.srq_num = resp.srqn;
    if (xrcd) srq->vsrq.xrcd = &to_xrcd(xrcd)->vx;
    if (cq) srq->vsrq.cq = cq;
    attr.max_wr = rq.max_wr;
    attr.max_sge = rq.max_sge;
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_srqs.insert(&s);
    return &s;
}

}  // namespace

ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* init) {
    return create_common(pd, init->attr, init->srq_context, SrqKind{});
}

// Basic, XRC and tag-matching SRQs.
ibv_srq* create_srq_ex(ibv_context* ibctx, ibv_srq_init_attr_ex* a) {
    constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                                IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    const ibv_srq_type type = (a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? a->srq_type : IBV_SRQT_BASIC;
    if ((a->comp_mask & ~kKnown) || (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC && type != IBV_SRQT_TM) ||
        (type == IBV_SRQT_TM && ctx_of(ibctx).dev_attr.max_tm_tags == 0)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd || a->pd->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    if (type == IBV_SRQT_BASIC) return create_common(a->pd, a->attr, a->srq_context, SrqKind{});
    const bool with_cq = (a->comp_mask & IBV_SRQ_INIT_ATTR_CQ) && a->cq && a->cq->context == ibctx;
    if (type == IBV_SRQT_TM) {
        // Its own CQ, and a tag list within the device's limits.
        const ibv_tm_cap& t = a->tm_cap;
        if (!with_cq || !(a->comp_mask & IBV_SRQ_INIT_ATTR_TM) || t.max_num_tags == 0 ||
            t.max_num_tags > ctx_of(ibctx).dev_attr.max_tm_tags || t.max_ops > abi::kMaxTmOps) {
            errno = EINVAL;
            return nullptr;
        }
        return create_common(a->pd, a->attr, a->srq_context, SrqKind{IBV_SRQT_TM, nullptr, a->cq, t.max_num_tags});
    }
    const bool named = (a->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) && a->xrcd && a->xrcd->context == ibctx;
    if (!named || !with_cq) {
        errno = EINVAL;
        return nullptr;
    }
    return create_common(a->pd, a->attr, a->srq_context, SrqKind{IBV_SRQT_XRC, a->xrcd, a->cq, 0});
}

// ibv_post_srq_ops: each operation is one command, done when it returns
// (its completion, if signaled, is in the SRQ's CQ by then).
int post_srq_ops(ibv_srq* ibsrq, ibv_ops_wr* wr, ibv_ops_wr** bad) {
    Srq* srq = to_srq(ibsrq);
    int rc = 0;
    for (; wr; wr = wr->next) {
        if (srq->vsrq.srq_type != IBV_SRQT_TM) {
            rc = EINVAL;
            break;
        }
        abi::CmdTmOpReq req{};
        req.wr_id = wr->wr_id;
        req.srq_handle = srq->handle;
        req.opcode = uint32_t(wr->opcode);
        req.flags = uint32_t(wr->flags);
        req.unexpected_cnt = wr->tm.unexpected_cnt;
        req.handle = wr->tm.handle;
        if (wr->opcode == IBV_WR_TAG_ADD) {
            if (wr->tm.add.num_sge < 0 || uint32_t(wr->tm.add.num_sge) > abi::kMaxTmSge ||
                (wr->tm.add.num_sge && !wr->tm.add.sg_list)) {
                rc = EINVAL;
                break;
            }
            req.recv_wr_id = wr->tm.add.recv_wr_id;
            req.tag = wr->tm.add.tag;
            req.mask = wr->tm.add.mask;
            req.num_sge = uint32_t(wr->tm.add.num_sge);
            for (uint32_t i = 0; i < req.num_sge; ++i) {
                const ibv_sge& s = wr->tm.add.sg_list[i];
                req.sge[i] = abi::Sge{s.addr, s.length, s.lkey};
            }
        }
        abi::CmdTmOpResp resp{};
        rc = command(*srq->ctx, abi::CmdOp::TmOp, &req, sizeof(req), &resp, sizeof(resp));
        if (rc) break;
        if (wr->opcode == IBV_WR_TAG_ADD) wr->tm.handle = resp.handle;
    }
    if (rc && bad) *bad = wr;
    return rc;
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
