// CreateSrq, ModifySrq, QuerySrq, DestroySrq.
#include <infiniband/verbs.h>

#include <cerrno>

#include "commands.h"
#include "transport.h"
#include "tag_matching.h"
#include "work_queue.h"

namespace vrdma::shim {

int cmd_create_srq(Engine& eng, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdCreateSrqReq>(req);
    const Quotas& q = ctx.quotas();
    Pd* pd = ctx.pds.get(r.pd_handle);
    if (!pd) return EINVAL;
    // An XRC SRQ belongs to a domain and completes into its own CQ.
    Xrcd* xrcd = nullptr;
    Cq* cq = nullptr;
    if (r.srq_type == IBV_SRQT_XRC) {
        xrcd = ctx.xrcds.get(r.xrcd_handle);
        cq = ctx.cqs.get(r.cq_handle);
        if (!xrcd || !cq) return EINVAL;
    } else if (r.srq_type == IBV_SRQT_TM) {
        // Tag matching is the shim's (tag_matching.h): not where a
        // transport holds SRQs the shim does not see.
        if (eng.device_attr(ctx).max_tm_tags == 0) return EOPNOTSUPP;
        cq = ctx.cqs.get(r.cq_handle);
        if (!cq || r.xrcd_handle || r.max_num_tags == 0 || r.max_num_tags > kTmMaxTags) return EINVAL;
    } else if (r.srq_type != IBV_SRQT_BASIC || r.xrcd_handle || r.cq_handle) {
        return EINVAL;
    }
    if (r.srq_type != IBV_SRQT_TM && r.max_num_tags) return EINVAL;
    if (r.max_sge == 0 || r.max_sge > q.max_sge) return EINVAL;
    uint64_t min_stride = sizeof(abi::RecvWqe) + uint64_t(r.max_sge) * sizeof(abi::Sge);
    if (!wq_geometry_ok(r.entries, q.max_srq_wr, r.stride, min_stride)) return EINVAL;
    PendingCharges charge(ctx);
    // A TM SRQ's tagged buffers are outstanding work as its WQEs are.
    if (!charge.take(Res::Srq, 1, "CreateSrq") ||
        !charge.take(Res::Wr, uint64_t(r.entries) + r.max_num_tags, "CreateSrq"))
        return ENOMEM;
    HostRange ring;
    if (int err = map_ring(ctx, r.ring_gva, abi::wq_ring_bytes(r.entries, r.stride), ring)) return err;
    auto srq = std::make_unique<Srq>();
    srq->pd = r.pd_handle;
    srq->wq.ring = reinterpret_cast<abi::RingHeader*>(ring.host);
    srq->wq.slots = ring.host + abi::wq_slots_offset();
    srq->wq.entries = r.entries;
    srq->wq.stride = r.stride;
    srq->wq.keep = std::move(ring.keepalive);
    wq_reset(srq->wq);
    srq->max_sge = r.max_sge;
    srq->limit = 0;  // like most HCAs, srq_limit is ignored at creation
    srq->srqn = eng.alloc_srqn();
    // An XRC SRQ is found by its number (responder.cpp): never 0, never
    // one of this context's live XRC SRQs (the shim-wide counter wraps at
    // 24 bits, and another guest may turn it).
    while (xrcd && (srq->srqn == 0 || ctx.xrc_srqs.count(srq->srqn))) srq->srqn = eng.alloc_srqn();
    srq->user_handle = r.user_handle;
    // XRC and tag matching run on this host and the TCP fabric only.
    if (!xrcd && r.srq_type == IBV_SRQT_BASIC)
        for (Transport* t : eng.object_keepers()) t->srq_made(eng, *pd, *srq);
    if (r.srq_type == IBV_SRQT_TM) {
        srq->tm = std::make_unique<TagList>();
        srq->tm->entries.resize(r.max_num_tags);
    }
    srq->xrcd = xrcd ? r.xrcd_handle : 0;
    srq->cq = cq ? r.cq_handle : 0;
    uint32_t srqn = srq->srqn;
    uint32_t h = ctx.srqs.insert(std::move(srq));
    if (!h) return ENOMEM;
    charge.keep();
    ++pd->users;
    if (cq) ++cq->users;  // an XRC or TM SRQ's own CQ
    if (xrcd) {
        ++xrcd->users;
        ctx.xrc_srqs[srqn] = h;
    }
    store_resp(resp, abi::CmdCreateSrqResp{h, srqn});
    return 0;
}

int cmd_modify_srq(Engine&, Context& ctx, const uint8_t* req, uint8_t*) {
    auto r = load_req<abi::CmdModifySrqReq>(req);
    Srq* srq = ctx.srqs.get(r.srq_handle);
    if (!srq) return ENOENT;
    if (r.attr_mask & ~uint32_t(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
    if (r.attr_mask & IBV_SRQ_MAX_WR) return EINVAL;  // resizing is not supported
    if (r.attr_mask & IBV_SRQ_LIMIT) {
        if (r.srq_limit > srq->wq.entries) return EINVAL;
        srq->limit = r.srq_limit;
    }
    return 0;
}

int cmd_query_srq(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Srq* srq = ctx.srqs.get(r.handle);
    if (!srq) return ENOENT;
    store_resp(resp, abi::CmdQuerySrqResp{srq->wq.entries, srq->max_sge, srq->limit});
    return 0;
}

int cmd_destroy_srq(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Srq* srq = ctx.srqs.get(r.handle);
    if (!srq) return ENOENT;
    if (srq->users) return EBUSY;
    store_resp(resp, abi::CmdDestroyResp{0, srq->async_events});
    auto gone = ctx.srqs.erase(r.handle);
    ctx.charges.give(Res::Srq, 1);
    ctx.charges.give(Res::Wr, gone->wq.entries + (gone->tm ? gone->tm->entries.size() : 0));
    if (Pd* pd = ctx.pds.get(gone->pd)) --pd->users;
    if (gone->cq)
        if (Cq* cq = ctx.cqs.get(gone->cq)) --cq->users;
    if (gone->xrcd) {
        ctx.xrc_srqs.erase(gone->srqn);
        if (Xrcd* x = ctx.xrcds.get(gone->xrcd)) --x->users;
    }
    return 0;
}

int cmd_tm_op(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdTmOpReq>(req);
    Srq* srq = ctx.srqs.get(r.srq_handle);
    if (!srq || !srq->tm) return EINVAL;
    uint32_t handle = 0;
    if (int rc = tm_list_op(ctx, *srq, r, handle)) return rc;
    store_resp(resp, abi::CmdTmOpResp{handle});
    return 0;
}

}  // namespace vrdma::shim
