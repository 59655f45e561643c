#include "memory_windows.h"

#include <infiniband/verbs.h>

#include "work_queue.h"

namespace vrdma::shim {
namespace {

constexpr uint32_t kRemoteAccess = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

// The window a bind, invalidation or remote request names, if it is of
// this context.
Mw* window_of(const Context& ctx, uint32_t rkey) { return ctx.mws.get(ctx.keys.lookup(rkey, KeyKind::Mw)); }

// The checks of a bind that concern the MR (C10-73 to C10-75): 0 or the MR.
Mr* bind_target(Context& ctx, const Qp& qp, const Mw& mw, const abi::SendWqe& w) {
    Mr* mr = ctx.mrs.get(ctx.keys.lookup(w.mr_lkey, KeyKind::Mr));
    if (!mr || mr->pd != mw.pd || mr->pd != qp.pd) return nullptr;
    if (!(mr->access & IBV_ACCESS_MW_BIND)) return nullptr;
    if ((w.mw_access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(mr->access & IBV_ACCESS_LOCAL_WRITE))
        return nullptr;
    if (!range_inside(w.remote_addr, w.compare_add, mr->addr, mr->length)) return nullptr;
    return mr;
}

}  // namespace

void unbind_window(Context& ctx, Mw& mw) {
    if (mw.bound)
        if (Mr* mr = ctx.mrs.get(mw.mr); mr && mr->bound_windows) --mr->bound_windows;
    mw.bound = false;
    mw.mr = mw.qp = mw.access = 0;
    mw.addr = mw.length = 0;
}

uint32_t bind_window(Context& ctx, const Qp& qp, const abi::SendWqe& w) {
    Mw* mw = ctx.mws.get(w.mw_handle);
    // The new rkey keeps the window's index; only its tag is the consumer's.
    if (!mw || mw->pd != qp.pd || (w.rkey >> 8) != (mw->key >> 8)) return IBV_WC_MW_BIND_ERR;
    // A window grants remote access only: local write, which applications
    // often pass along (rdma-core's own tests do), means nothing for it and
    // is ignored, as devices do. Zero-based windows are not offered (nor are
    // zero-based MRs), and bits verbs does not define are refused.
    if (w.mw_access & ~(kRemoteAccess | IBV_ACCESS_LOCAL_WRITE)) return IBV_WC_MW_BIND_ERR;
    // A bind of length 0 unbinds, whatever MR it names (ibv_bind_mw(3)).
    const bool unbind = w.compare_add == 0;
    if (mw->type == IBV_MW_TYPE_2 && (mw->bound || unbind)) return IBV_WC_MW_BIND_ERR;  // o10-37.2.30, .40
    Mr* mr = nullptr;
    if (!unbind) {
        mr = bind_target(ctx, qp, *mw, w);
        if (!mr) return IBV_WC_MW_BIND_ERR;
    }
    unbind_window(ctx, *mw);
    ctx.keys.retag(mw->key, w.rkey);
    mw->key = w.rkey;
    if (unbind) return IBV_WC_SUCCESS;
    mw->bound = true;
    mw->mr = ctx.keys.lookup(w.mr_lkey, KeyKind::Mr);
    mw->qp = mw->type == IBV_MW_TYPE_2 ? qp.handle : 0;
    mw->access = w.mw_access & kRemoteAccess;
    mw->addr = w.remote_addr;
    mw->length = w.compare_add;
    ++mr->bound_windows;
    return IBV_WC_SUCCESS;
}

uint32_t invalidate_local(Context& ctx, const Qp& qp, uint32_t rkey) {
    Mw* mw = window_of(ctx, rkey);
    if (!mw || mw->type != IBV_MW_TYPE_2 || !mw->bound || mw->pd != qp.pd) return IBV_WC_LOC_QP_OP_ERR;
    unbind_window(ctx, *mw);
    return IBV_WC_SUCCESS;
}

bool invalidate_remote(Context& ctx, const Qp& qp, uint32_t rkey) { return invalidate_remote(ctx, qp, qp.pd, rkey); }

bool invalidate_remote(Context& ctx, const Qp& qp, uint32_t pd, uint32_t rkey) {
    Mw* mw = window_of(ctx, rkey);
    if (!mw || mw->type != IBV_MW_TYPE_2 || !mw->bound || mw->pd != pd || mw->qp != qp.handle) return false;
    unbind_window(ctx, *mw);
    return true;
}

uint8_t* resolve_window(const Context& ctx, const Qp& qp, uint32_t pd, uint32_t rkey, uint64_t addr, uint64_t len,
                        uint32_t access, const std::shared_ptr<Mapping>** keep) {
    const Mw* mw = window_of(ctx, rkey);
    if (!mw || !mw->bound || mw->pd != pd || (mw->access & access) != access) return nullptr;
    if (mw->type == IBV_MW_TYPE_2 && mw->qp != qp.handle) return nullptr;
    if (!range_inside(addr, len, mw->addr, mw->length)) return nullptr;
    Mr* mr = ctx.mrs.get(mw->mr);
    if (!mr || !range_inside(addr, len, mr->addr, mr->length)) return nullptr;
    return mr_bytes(ctx, *mr, addr, len, keep);
}

}  // namespace vrdma::shim
