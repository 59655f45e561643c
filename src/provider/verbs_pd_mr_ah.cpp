// Protection domains, memory regions and address handles.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "context.h"
#include "objects.h"
#include "on_demand.h"
#include "verbs.h"
#include "vrdma_common/log.h"

namespace vrdma::prov {

Pd* new_pd(ibv_context* ibctx, uint32_t handle, Pd* protection) {
    auto* pd = new (std::nothrow) Pd{};
    if (!pd) {
        errno = ENOMEM;
        return nullptr;
    }
    pd->ibv.context = ibctx;
    pd->ibv.handle = handle;
    pd->protection = protection;
    return pd;
}

ibv_pd* alloc_pd(ibv_context* ibctx) {
    Context& ctx = ctx_of(ibctx);
    abi::CmdAllocPdResp resp{};
    if (int rc = command(ctx, abi::CmdOp::AllocPd, nullptr, 0, &resp, sizeof(resp))) {
        errno = rc;
        return nullptr;
    }
    Pd* pd = new_pd(ibctx, resp.pd_handle);
    if (!pd) {
        abi::CmdHandleReq req{resp.pd_handle};
        command(ctx, abi::CmdOp::DeallocPd, &req, sizeof(req), nullptr, 0);
        errno = ENOMEM;
        return nullptr;
    }
    std::lock_guard lock(ctx.mem_mu);
    ctx.pd_handles.insert(resp.pd_handle);  // what ibv_import_pd may name
    return &pd->ibv;
}

int dealloc_pd(ibv_pd* ibpd) {
    Pd* pd = to_pd(ibpd);
    if (pd->protection) {  // a parent domain: the protection domain stays
        pd->protection->parent_domains.fetch_sub(1);
        delete pd;
        return 0;
    }
    if (pd->parent_domains.load() != 0) return EBUSY;
    Context& ctx = ctx_of(ibpd->context);
    abi::CmdHandleReq req{ibpd->handle};
    int rc = command(ctx, abi::CmdOp::DeallocPd, &req, sizeof(req), nullptr, 0);
    if (rc && rc != EIO) return rc;  // shim gone: nothing left to free there
    {
        std::lock_guard lock(ctx.mem_mu);
        ctx.pd_handles.erase(ibpd->handle);
    }
    delete pd;
    return 0;
}

// ibv_reg_mr and ibv_reg_mr_iova: `hca_va` is the address work requests
// name the first byte by. As the kernel's uverbs, it must share the
// address's offset in its page.
ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t hca_va, int access) {
    if (length == 0 || ((hca_va ^ reinterpret_cast<uintptr_t>(addr)) & (abi::kPageSize - 1)) ||
        (access & IBV_ACCESS_ZERO_BASED)) {  // zero-based: device memory only (ibv_reg_dm_mr)
        errno = EINVAL;
        return nullptr;
    }
    if (access & IBV_ACCESS_ON_DEMAND)
        return register_on_demand(pd, reinterpret_cast<uintptr_t>(addr), length, hca_va, access);
    return register_memory(pd, reinterpret_cast<uintptr_t>(addr), length, hca_va, access, nullptr);
}

ibv_mr* register_memory(ibv_pd* pd, uintptr_t addr, size_t length, uint64_t iova, int access, Dm* dm,
                        bool on_demand) {
    Context& ctx = ctx_of(pd->context);
    auto* mr = new (std::nothrow) Mr{};
    if (!mr) {
        errno = ENOMEM;
        return nullptr;
    }
    std::lock_guard lock(ctx.mem_mu);
    // A zero-length MR (device memory only) names no memory: nothing to share.
    int rc = length && !on_demand ? share_range(ctx, addr, length, &mr->segments) : 0;
    if (rc == 0) {
        abi::CmdRegMrReq req{};
        req.pd_handle = pd->handle;
        req.access = uint32_t(access);
        req.addr = addr;
        req.length = length;
        req.iova = iova;
        abi::CmdRegMrResp resp{};
        rc = command(ctx, abi::CmdOp::RegMr, &req, sizeof(req), &resp, sizeof(resp));
        if (rc == 0) {
            ibv_mr& m = mr->vmr.ibv_mr;
            m.context = pd->context;
            m.pd = pd;
            m.addr = dm ? reinterpret_cast<void*>(uintptr_t(iova)) : reinterpret_cast<void*>(addr);
            m.length = length;
            m.handle = resp.mr_handle;
            m.lkey = resp.lkey;
            m.rkey = resp.rkey;
            mr->vmr.mr_type = IBV_MR_TYPE_MR;
            mr->vmr.access = access;
            mr->handle = resp.mr_handle;
            mr->dm = dm;
            if (dm) dm_mr_made(dm);
            if (access & IBV_ACCESS_ON_DEMAND) track_odp(ctx, *mr, on_demand);
            ctx.mrs[mr->handle] = mr;  // what ibv_import_mr may name
            return &m;
        }
        release_segments(ctx, mr->segments);
    }
    delete mr;
    errno = rc;
    return nullptr;
}

int dereg_mr(verbs_mr* vmr) {
    Mr* mr = to_mr(vmr);
    Context& ctx = ctx_of(vmr->ibv_mr.context);
    std::lock_guard lock(ctx.mem_mu);
    abi::CmdHandleReq req{mr->handle};
    int rc = command(ctx, abi::CmdOp::DeregMr, &req, sizeof(req), nullptr, 0);
    if (rc && rc != EIO) return rc;  // shim gone: the MR is gone with it
    ctx.mrs.erase(mr->handle);  // deregistered through it or an import of it: gone for both
    untrack_odp(ctx, *mr);
    release_segments(ctx, mr->segments);
    if (mr->dm) dm_mr_gone(mr->dm);
    delete mr;
    return 0;
}

// ibv_rereg_mr: the new range (CHANGE_TRANSLATION) is shared as ibv_reg_mr
// shares it, then the shim changes the MR in place (the same keys, except
// on a shim with a device: its answer has them). libibverbs updates
// mr->pd, addr and length when this returns 0.
int rereg_mr(verbs_mr* vmr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
    Mr* mr = to_mr(vmr);
    Context& ctx = ctx_of(vmr->ibv_mr.context);
    auto fail = [](int e) {
        errno = e;
        return e;
    };
    if ((flags & IBV_REREG_MR_CHANGE_PD) && (!pd || pd->context != vmr->ibv_mr.context)) return fail(EINVAL);
    if (mr->dm) return fail(EINVAL);  // an MR over device memory stays as registered (as on mlx5)
    // An ODP MR stays as registered: its faults follow its registration
    // (rxe refuses any re-registration of an ODP MR too).
    if (vmr->access & IBV_ACCESS_ON_DEMAND) return fail(EOPNOTSUPP);
    std::lock_guard lock(ctx.mem_mu);
    std::vector<uint32_t> segments;
    bool translate = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
    if (translate) {
        if (int rc = share_range(ctx, reinterpret_cast<uintptr_t>(addr), length, &segments)) return fail(rc);
    }
    abi::CmdReregMrReq req{};
    req.mr_handle = mr->handle;
    req.flags = uint32_t(flags);
    req.pd_handle = (flags & IBV_REREG_MR_CHANGE_PD) ? pd->handle : 0;
    req.access = uint32_t(access);
    req.addr = reinterpret_cast<uintptr_t>(addr);
    req.length = length;
    abi::CmdReregMrResp resp{};
    if (int rc = command(ctx, abi::CmdOp::ReregMr, &req, sizeof(req), &resp, sizeof(resp))) {
        if (translate) release_segments(ctx, segments);
        return fail(rc);
    }
    vmr->ibv_mr.lkey = resp.lkey;
    vmr->ibv_mr.rkey = resp.rkey;
    if (translate) {
        release_segments(ctx, mr->segments);
        mr->segments = std::move(segments);
    }
    if (flags & IBV_REREG_MR_CHANGE_ACCESS) vmr->access = access;
    return 0;
}

ibv_ah* create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
    Context& ctx = ctx_of(pd->context);
    if (attr->port_num != 1) {
        errno = EINVAL;
        return nullptr;
    }
    abi::CmdCreateAhReq req{};
    req.pd_handle = pd->handle;
    abi::AhAttr& a = req.attr;
    a.dlid = attr->dlid;
    a.sl = attr->sl;
    a.src_path_bits = attr->src_path_bits;
    a.static_rate = attr->static_rate;
    a.is_global = attr->is_global;
    a.port_num = attr->port_num;
    if (attr->is_global) {
        a.sgid_index = attr->grh.sgid_index;
        std::memcpy(a.dgid, attr->grh.dgid.raw, sizeof(a.dgid));
        a.flow_label = attr->grh.flow_label;
        a.hop_limit = attr->grh.hop_limit;
        a.traffic_class = attr->grh.traffic_class;
    }
    abi::CmdCreateAhResp resp{};
    if (int rc = command(ctx, abi::CmdOp::CreateAh, &req, sizeof(req), &resp, sizeof(resp))) {
        errno = rc;
        return nullptr;
    }
    auto* ah = new (std::nothrow) Ah{};
    if (!ah) {
        abi::CmdHandleReq d{resp.ah_handle};
        command(ctx, abi::CmdOp::DestroyAh, &d, sizeof(d), nullptr, 0);
        errno = ENOMEM;
        return nullptr;
    }
    ah->ibv.context = pd->context;
    ah->ibv.pd = pd;
    ah->ibv.handle = resp.ah_handle;
    ah->handle = resp.ah_handle;
    return &ah->ibv;
}

int destroy_ah(ibv_ah* ibah) {
    Ah* ah = to_ah(ibah);
    abi::CmdHandleReq req{ah->handle};
    int rc = command(ctx_of(ibah->context), abi::CmdOp::DestroyAh, &req, sizeof(req), nullptr, 0);
    if (rc && rc != EIO) return rc;
    delete ah;
    return 0;
}

}  // namespace vrdma::prov
