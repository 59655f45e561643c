// AllocPd, DeallocPd, RegMr, DeregMr, ReregMr, AllocMw, DeallocMw.
#include <infiniband/verbs.h>

#include <cerrno>

#include "commands.h"
#include "transport.h"
#include "memory_windows.h"

namespace vrdma::shim {
namespace {

constexpr uint32_t kOptionalAccess = IBV_ACCESS_OPTIONAL_RANGE;  // may be ignored by definition
constexpr uint32_t kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_HUGETLB |
                               IBV_ACCESS_ON_DEMAND | kOptionalAccess;
// Flags that say how the MR is made, not what it allows: not kept in
// Mr::access (a device registration of an ODP MR's mapping is an ordinary one).
constexpr uint32_t kMakingAccess = kOptionalAccess | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND;

// The access flags of a registration: 0 or EINVAL, as the kernel checks
// them (ib_check_mr_access). IBV_ACCESS_ZERO_BASED is not among them
// (EINVAL): RegMr takes it off first, ReregMr cannot change it.
int check_access(uint32_t access) {
    if (access & ~kMrAccess) return EINVAL;
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
        return EINVAL;
    return 0;
}

bool range_ok(const Context& ctx, uint64_t addr, uint64_t length) {
    return length != 0 && length <= ctx.quotas().max_mr_size && addr + length >= addr;
}

// The implicit ODP MR: the whole address space (ibv_reg_mr(pd, NULL, SIZE_MAX, ...)).
bool implicit_odp(const abi::CmdRegMrReq& r) {
    return (r.access & IBV_ACCESS_ON_DEMAND) && r.addr == 0 && r.iova == 0 && r.length == UINT64_MAX;
}

}  // namespace

int cmd_alloc_pd(Engine& eng, Context& ctx, const uint8_t*, uint8_t* resp) {
    PendingCharges charge(ctx);
    if (!charge.take(Res::Pd, 1, "AllocPd")) return ENOMEM;
    auto pd = std::make_unique<Pd>();
    for (Transport* t : eng.object_keepers())
        if (int err = t->pd_made(eng, *pd)) return err;
    uint32_t h = ctx.pds.insert(std::move(pd));
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

int cmd_reg_mr(Engine& eng, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdRegMrReq>(req);
    Pd* pd = ctx.pds.get(r.pd_handle);
    if (!pd) return EINVAL;
    if (int err = check_access(r.access & ~uint32_t(IBV_ACCESS_ZERO_BASED))) return err;
    // The work requests' view (iova) must fit as the memory's does; a
    // zero-based MR starts at 0, and only one of those may be empty.
    const bool zero_based = r.access & IBV_ACCESS_ZERO_BASED;
    if (zero_based && r.iova != 0) return EINVAL;
    const bool implicit = implicit_odp(r);
    if (!implicit) {
        if (r.iova + r.length < r.iova) return EINVAL;
        if (!(zero_based && r.length == 0) && !range_ok(ctx, r.addr, r.length)) return EINVAL;
    }
    // The implicit MR's bytes are the segments' (charged as they come), not its length.
    const uint64_t charged_bytes = implicit ? 0 : r.length;
    PendingCharges charge(ctx);
    if (!charge.take(Res::Mr, 1, "RegMr") || !charge.take(Res::MrBytes, charged_bytes, "RegMr")) return ENOMEM;
    auto mr = std::make_unique<Mr>();
    if (r.length) {
        int err = implicit ? EFAULT : ctx.segments.map_range(r.addr, r.length, mr->mem, ctx.charges.usage());
        // ODP over memory not all shared yet: served on demand, at the
        // addresses the guest's faults share (so named by those addresses).
        if (err == EFAULT && (r.access & IBV_ACCESS_ON_DEMAND) && r.iova == r.addr)
            mr->on_demand = true;
        else if (err)
            return err;
    }
    mr->pd = r.pd_handle;
    mr->access = r.access & ~kMakingAccess;
    mr->addr = r.iova;
    mr->length = r.length;
    mr->charged_bytes = charged_bytes;
    // A transport that keeps MRs of its own (a device: hca_device.h)
    // registers the memory too, at the addresses work requests name it by,
    // and its key is the MR's.
    uint32_t made_key = 0;
    for (Transport* t : eng.object_keepers()) {
        const Transport::MrShape shape{mr->mem.host, r.length, r.iova, mr->access};
        if (int err = t->mr_made(eng, *pd, *mr, shape, false, mr->kept, made_key)) return err;
    }
    Mr* m = mr.get();
    uint32_t h = ctx.mrs.insert(std::move(mr));
    if (!h) return ENOMEM;
    if (made_key) {
        m->key = made_key;
        if (!ctx.keys.insert(m->key, h, KeyKind::Mr)) {  // taken by a window's key: refuse rather than alias
            ctx.mrs.erase(h);
            return ENOMEM;
        }
    } else {
        m->key = ctx.keys.alloc(h, KeyKind::Mr);  // random, not the handle: keys must not be guessable
    }
    charge.keep();
    ++pd->users;
    store_resp(resp, abi::CmdRegMrResp{h, m->key, m->key});
    return 0;
}

int cmd_dereg_mr(Engine&, Context& ctx, const uint8_t* req, uint8_t*) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Mr* bound = ctx.mrs.get(r.handle);
    if (!bound) return ENOENT;
    if (bound->bound_windows) return EINVAL;  // IBA 10.6.7.2.6, as rxe
    auto mr = ctx.mrs.erase(r.handle);
    ctx.keys.release(mr->key);
    ctx.charges.give(Res::Mr, 1);
    ctx.charges.give(Res::MrBytes, mr->charged_bytes);
    if (Pd* pd = ctx.pds.get(mr->pd)) --pd->users;
    return 0;
}

// Changes an MR in place: it keeps its handle, and its keys unless it is
// registered on a device (then it is registered there anew and takes the
// new device key). Everything is checked, and the new mapping and device
// registration made, before anything changes, so a refusal leaves the MR
// as it was.
int cmd_rereg_mr(Engine& eng, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdReregMrReq>(req);
    Mr* mr = ctx.mrs.get(r.mr_handle);
    if (!mr || mr->bound_windows) return EINVAL;
    // An ODP MR stays as registered (as on rxe); no MR becomes one.
    if (mr->on_demand || (r.access & IBV_ACCESS_ON_DEMAND)) return EOPNOTSUPP;
    constexpr uint32_t kFlags = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
    if (r.flags == 0 || (r.flags & ~kFlags)) return EINVAL;
    Pd* new_pd = nullptr;
    if (r.flags & IBV_REREG_MR_CHANGE_PD) {
        new_pd = ctx.pds.get(r.pd_handle);
        if (!new_pd) return EINVAL;
    }
    if (r.flags & IBV_REREG_MR_CHANGE_ACCESS) {
        if (int err = check_access(r.access)) return err;
    }
    HostRange mem;
    PendingCharges charge(ctx);
    if (r.flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        if (!range_ok(ctx, r.addr, r.length)) return EINVAL;
        if (!charge.take(Res::MrBytes, r.length, "ReregMr")) return ENOMEM;
        if (int err = ctx.segments.map_range(r.addr, r.length, mem, ctx.charges.usage())) return err;
    }
    const uint32_t access = (r.flags & IBV_REREG_MR_CHANGE_ACCESS) ? r.access & ~kMakingAccess : mr->access;
    // A transport's own MR is made again as the MR will be; its key
    // becomes the MR's.
    for (Transport* t : eng.object_keepers()) {
        const bool moved = r.flags & IBV_REREG_MR_CHANGE_TRANSLATION;
        const Pd* pd = new_pd ? new_pd : ctx.pds.get(mr->pd);
        if (!pd) return EINVAL;
        const Transport::MrShape shape{moved ? mem.host : mr->mem.host, moved ? r.length : mr->length,
                                       moved ? r.addr : mr->addr, access};
        Kept made;
        uint32_t key = 0;
        if (int err = t->mr_made(eng, *pd, *mr, shape, true, made, key)) return err;
        if (!made) continue;
        if (key != mr->key) {
            if (!ctx.keys.insert(key, r.mr_handle, KeyKind::Mr)) return ENOMEM;
            ctx.keys.release(mr->key);
            mr->key = key;
        }
        mr->kept = std::move(made);  // the old one goes here
    }
    if (r.flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        ctx.charges.give(Res::MrBytes, mr->charged_bytes);
        charge.keep();
        mr->addr = r.addr;
        mr->length = r.length;
        mr->charged_bytes = r.length;
        mr->mem = std::move(mem);
    }
    mr->access = access;
    if (new_pd) {
        if (Pd* old_pd = ctx.pds.get(mr->pd)) --old_pd->users;
        ++new_pd->users;
        mr->pd = r.pd_handle;
    }
    store_resp(resp, abi::CmdReregMrResp{mr->key, mr->key});
    return 0;
}

// A window starts unbound, its rkey already its own (memory_windows.h).
// A transport that keeps windows of its own (a device: hca_device.h) gives
// it its window and rkey.
int cmd_alloc_mw(Engine& eng, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdAllocMwReq>(req);
    Pd* pd = ctx.pds.get(r.pd_handle);
    if (!pd) return EINVAL;
    if (r.type != IBV_MW_TYPE_1 && r.type != IBV_MW_TYPE_2) return EINVAL;
    PendingCharges charge(ctx);
    if (!charge.take(Res::Mw, 1, "AllocMw")) return ENOMEM;
    auto mw = std::make_unique<Mw>();
    mw->pd = r.pd_handle;
    mw->type = r.type;
    Mw* w = mw.get();
    uint32_t h = ctx.mws.insert(std::move(mw));
    if (!h) return ENOMEM;
    for (Transport* t : eng.object_keepers()) {
        Kept made;
        uint32_t key = 0;
        t->mw_made(eng, *pd, r.type, made, key);
        // A key whose index is live already (a key of the shim's own) is
        // not taken twice: the window is then the shim's only.
        if (made && !w->key && ctx.keys.insert(key, h, KeyKind::Mw)) {
            w->key = key;
            w->kept = std::move(made);
        }
    }
    if (!w->key) w->key = ctx.keys.alloc(h, KeyKind::Mw);
    charge.keep();
    ++pd->users;
    store_resp(resp, abi::CmdAllocMwResp{h, w->key});
    return 0;
}

// A bound window is unbound first: its MR may go after.
int cmd_dealloc_mw(Engine&, Context& ctx, const uint8_t* req, uint8_t*) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Mw* w = ctx.mws.get(r.handle);
    if (!w) return ENOENT;
    unbind_window(ctx, *w);
    ctx.keys.release(w->key);
    const uint32_t pd = w->pd;
    ctx.mws.erase(r.handle);
    ctx.charges.give(Res::Mw, 1);
    if (Pd* p = ctx.pds.get(pd)) --p->users;
    return 0;
}

}  // namespace vrdma::shim
