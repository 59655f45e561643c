// On-demand paging (IBV_ACCESS_ON_DEMAND, docs/protocol.md "On-demand
// paging"). An ODP MR whose range is all mapped at registration is shared
// then, like any MR. One that is not (the implicit MR over the whole
// address space, or a range with pages not mapped yet) is registered with
// nothing shared, and its pages are shared when they are first named: by a
// work request posted with its lkey (the provider is the software device's
// page-fault handler) or by ibv_advise_mr.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rdma_core_private.h"

namespace vrdma::prov {

struct Context;
struct Mr;

// ibv_reg_mr with IBV_ACCESS_ON_DEMAND (after reg_mr's own checks).
ibv_mr* register_on_demand(ibv_pd* pd, uintptr_t addr, size_t length, uint64_t iova, int access);

// Every ODP MR is known by its lkey from registration to deregistration
// (ibv_advise_mr checks what it names); `on_demand` says it was registered
// with nothing shared. The caller holds the context's mem_mu.
void track_odp(Context& ctx, Mr& mr, bool on_demand);
void untrack_odp(Context& ctx, Mr& mr);

// The page fault: every SGE whose lkey is an on-demand MR of `ctx` and whose
// range is not shared yet is shared now. Called by the post paths before a
// WQE is published. Costs one atomic load when the context has no such MR.
// Never fails the post: a range that cannot be shared (not mapped) is left
// to the shim, whose completion says IBV_WC_LOC_PROT_ERR, as a device's does.
void fault_in_sges(Context& ctx, const ibv_sge* list, size_t n);

// ibv_advise_mr: prefetch (share) ranges of on-demand MRs.
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge);

}  // namespace vrdma::prov
