// AllocPd, DeallocPd, RegMr, DeregMr.
#include <infiniband/verbs.h>

#include <cerrno>

#include "commands.h"

namespace vrdma::shim {
namespace {

constexpr uint32_t kOptionalAccess = IBV_ACCESS_OPTIONAL_RANGE;  // may be ignored by definition
constexpr uint32_t kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_HUGETLB |
                               kOptionalAccess;

}  // namespace

int cmd_alloc_pd(Engine&, Context& ctx, const uint8_t*, uint8_t* resp) {
    PendingCharges charge(ctx);
    if (!charge.take(Res::Pd, 1, "AllocPd")) return ENOMEM;
    uint32_t h = ctx.pds.insert(std::make_unique<Pd>());
    if (!h) return ENOMEM;
    charge.keep();
    store_resp(resp, abi::CmdAllocPdResp{h});
    return 0;
}

int cmd_dealloc_pd(Engine&, Context& ctx, const uint8_t* req, uint8_t*) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Pd* pd = ctx.pds.get(r.handle);
    if (!pd) return ENOENT;
    if (pd->users) return EBUSY;
    ctx.pds.erase(r.handle);
    ctx.charges.give(Res::Pd, 1);
    return 0;
}

int cmd_reg_mr(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdRegMrReq>(req);
    Pd* pd = ctx.pds.get(r.pd_handle);
    if (!pd) return EINVAL;
    if (r.access & ~kMrAccess) return EINVAL;
    if ((r.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(r.access & IBV_ACCESS_LOCAL_WRITE))
        return EINVAL;
    if (r.length == 0 || r.length > ctx.quotas().max_mr_size || r.addr + r.length < r.addr) return EINVAL;
    PendingCharges charge(ctx);
    if (!charge.take(Res::Mr, 1, "RegMr") || !charge.take(Res::MrBytes, r.length, "RegMr")) return ENOMEM;
    auto mr = std::make_unique<Mr>();
    int err = ctx.segments.map_range(r.addr, r.length, mr->mem, ctx.charges.usage());
    if (err) return err;
    mr->pd = r.pd_handle;
    mr->access = r.access & ~kOptionalAccess;
    mr->addr = r.addr;
    mr->length = r.length;
    Mr* m = mr.get();
    uint32_t h = ctx.mrs.insert(std::move(mr));
    if (!h) return ENOMEM;
    m->key = ctx.keys.alloc(h);  // random, not the handle: keys must not be guessable
    charge.keep();
    ++pd->users;
    store_resp(resp, abi::CmdRegMrResp{h, m->key, m->key});
    return 0;
}

int cmd_dereg_mr(Engine&, Context& ctx, const uint8_t* req, uint8_t*) {
    auto r = load_req<abi::CmdHandleReq>(req);
    auto mr = ctx.mrs.erase(r.handle);
    if (!mr) return ENOENT;
    ctx.keys.release(mr->key);
    ctx.charges.give(Res::Mr, 1);
    ctx.charges.give(Res::MrBytes, mr->length);
    if (Pd* pd = ctx.pds.get(mr->pd)) --pd->users;
    return 0;
}

}  // namespace vrdma::shim
