// XRC domains (ibv_open_xrcd). XRC QPs are made in verbs_qp.cpp, XRC SRQs
// in verbs_srq.cpp (docs/protocol.md "XRC").
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <mutex>
#include <new>

#include "context.h"
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
    abi::CmdHandleReq req{x->vx.handle};
    int rc = command(ctx, abi::CmdOp::CloseXrcd, &req, sizeof(req), nullptr, 0);
    if (rc && rc != EIO) return rc;  // EBUSY: QPs or SRQs are in it
    std::erase(ctx.xrcds, x);
    delete x;
    return 0;
}

}  // namespace vrdma::prov
