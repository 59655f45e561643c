// Memory windows: ibv_alloc_mw, ibv_dealloc_mw and ibv_bind_mw (type 1).
// A window is bound by a WQE on a QP (IBV_WR_BIND_MW), which the shim runs
// in the QP's order (protocol.md "Memory windows").
#include <cerrno>
#include <new>

#include "context.h"
#include "data_path.h"
#include "objects.h"
#include "verbs.h"

namespace vrdma::prov {

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) {
    Context& ctx = ctx_of(pd->context);
    if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
        errno = EINVAL;
        return nullptr;
    }
    abi::CmdAllocMwReq req{pd->handle, uint32_t(type)};
    abi::CmdAllocMwResp resp{};
    if (int rc = command(ctx, abi::CmdOp::AllocMw, &req, sizeof(req), &resp, sizeof(resp))) {
        errno = rc;
        return nullptr;
    }
    auto* mw = new (std::nothrow) ibv_mw{};
    if (!mw) {
        abi::CmdHandleReq d{resp.mw_handle};
        command(ctx, abi::CmdOp::DeallocMw, &d, sizeof(d), nullptr, 0);
        errno = ENOMEM;
        return nullptr;
    }
    mw->context = pd->context;
    mw->pd = pd;
    mw->rkey = resp.rkey;
    mw->handle = resp.mw_handle;
    mw->type = type;
    return mw;
}

int dealloc_mw(ibv_mw* mw) {
    abi::CmdHandleReq req{mw->handle};
    int rc = command(ctx_of(mw->context), abi::CmdOp::DeallocMw, &req, sizeof(req), nullptr, 0);
    if (rc && rc != EIO) return rc;  // shim gone: the window went with it
    delete mw;
    return 0;
}

// Type 1 (libibverbs has checked the type and the MR's PD): a bind WQE with
// the window's next rkey. As in rxe, mw->rkey takes that key once the WQE
// is posted; if its completion reports an error, the window keeps its old
// key and the application must restore mw->rkey.
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
    if (qp->context != mw->context) return EINVAL;
    ibv_send_wr wr{};
    wr.wr_id = bind->wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = bind->send_flags;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info = bind->bind_info;
    ibv_send_wr* bad = nullptr;
    if (int rc = post_send(qp, &wr, &bad)) return rc;
    mw->rkey = wr.bind_mw.rkey;
    return 0;
}

}  // namespace vrdma::prov
