// OpenXrcd, CloseXrcd: XRC domains. A domain is the context's own; it is
// charged as a PD (it costs the shim no more than one).
#include <cerrno>

#include "commands.h"

namespace vrdma::shim {

int cmd_open_xrcd(Engine&, Context& ctx, const uint8_t*, uint8_t* resp) {
    PendingCharges charge(ctx);
    if (!charge.take(Res::Pd, 1, "OpenXrcd")) return ENOMEM;
    uint32_t h = ctx.xrcds.insert(std::make_unique<Xrcd>());
    if (!h) return ENOMEM;
    charge.keep();
    store_resp(resp, abi::CmdOpenXrcdResp{h});
    return 0;
}

int cmd_close_xrcd(Engine&, Context& ctx, const uint8_t* req, uint8_t*) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Xrcd* x = ctx.xrcds.get(r.handle);
    if (!x) return ENOENT;
    if (x->users) return EBUSY;  // XRC_RECV QPs or XRC SRQs are in it
    ctx.xrcds.erase(r.handle);
    ctx.charges.give(Res::Pd, 1);
    return 0;
}

}  // namespace vrdma::shim
