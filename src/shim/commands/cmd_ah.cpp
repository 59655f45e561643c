// CreateAh, DestroyAh.
#include <cerrno>

#include "commands.h"
#include "requester.h"

namespace vrdma::shim {

int cmd_create_ah(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdCreateAhReq>(req);
    Pd* pd = ctx.pds.get(r.pd_handle);
    if (!pd) return EINVAL;
    const abi::AhAttr& a = r.attr;
    // A unicast LID, or a multicast one (multicast_groups.h); not the
    // permissive LID.
    if (a.dlid == 0 || a.dlid == 0xffff || a.sl > 15 || a.port_num != 1) return EINVAL;
    if (a.is_global > 1 || (a.is_global && a.sgid_index != 0)) return EINVAL;
    PendingCharges charge(ctx);
    if (!charge.take(Res::Ah, 1, "CreateAh")) return ENOMEM;
    auto ah = std::make_unique<Ah>();
    ah->pd = r.pd_handle;
    ah->attr = a;
    uint32_t h = ctx.ahs.insert(std::move(ah));
    if (!h) return ENOMEM;
    charge.keep();
    ++pd->users;
    store_resp(resp, abi::CmdCreateAhResp{h});
    return 0;
}

int cmd_destroy_ah(Engine& eng, Context& ctx, const uint8_t* req, uint8_t*) {
    auto r = load_req<abi::CmdHandleReq>(req);
    if (!ctx.ahs.get(r.handle)) return ENOENT;
    // The datagrams posted through it leave first (a device copies the
    // address into the WQE when it is posted; here the WQE names the AH).
    uint32_t allowance = kPostedDatagrams;
    ctx.qps.for_each([&](uint32_t, Qp& qp) { send_posted_datagrams(eng, ctx, qp, allowance); });
    auto ah = ctx.ahs.erase(r.handle);
    if (!ah) return ENOENT;
    ctx.charges.give(Res::Ah, 1);
    if (Pd* pd = ctx.pds.get(ah->pd)) --pd->users;
    return 0;
}

}  // namespace vrdma::shim
