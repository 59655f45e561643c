#include "on_demand.h"

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <vector>

#include "context.h"
#include "memory_registration.h"
#include "objects.h"
#include "proc_maps.h"
#include "verbs.h"

namespace vrdma::prov {
namespace {

// A fault shares the 2 MiB-aligned window around the range, inside the MR
// and inside the one mapping that holds the range, so that a buffer's
// neighbours come in with it: fewer segments for the shim to map, and fewer
// later faults. Other mappings are never touched by a fault.
constexpr uintptr_t kFaultWindow = uintptr_t(2) << 20;

bool implicit_range(uintptr_t addr, size_t length) { return addr == 0 && length == SIZE_MAX; }

uintptr_t mr_end(const Mr& mr) {
    const ibv_mr& m = mr.vmr.ibv_mr;
    return implicit_range(uintptr_t(m.addr), m.length) ? UINTPTR_MAX : uintptr_t(m.addr) + m.length;
}

// Whether every page of [addr, addr+length) is mapped now.
bool all_mapped(uintptr_t addr, size_t length) {
    const uintptr_t page = abi::kPageSize;
    uintptr_t cur = addr & ~(page - 1);
    const uintptr_t end = addr + length;
    for (const MapEntry& e : read_maps(false)) {
        if (e.end <= cur) continue;
        if (e.start > cur) return false;
        cur = e.end;
        if (cur >= end) return true;
    }
    return false;
}

// Whether [addr, addr+len) lies in segments this MR has had shared (one,
// or several that follow each other: the shim composes those). One pass:
// the ranges are sorted by start.
bool covered(const Mr& mr, uintptr_t addr, uint64_t len) {
    uintptr_t cur = addr;
    const uintptr_t end = addr + len;
    for (const auto& [start, stop] : mr.shared) {
        if (start > cur) break;
        if (stop > cur) cur = stop;
        if (cur >= end) return true;
    }
    return false;
}

void note_shared(Mr& mr, uintptr_t start, uintptr_t end) {
    auto it = std::lower_bound(mr.shared.begin(), mr.shared.end(), std::make_pair(start, uintptr_t(0)));
    if (it != mr.shared.end() && it->first == start)
        it->second = std::max(it->second, end);
    else
        mr.shared.insert(it, {start, end});
}

// Shares [addr, addr+len) for `mr`, keeping a reference on each segment
// (given back at deregistration). 0 or a positive errno.
int share_for(Context& ctx, Mr& mr, uintptr_t addr, uint64_t len, const char* verb) {
    std::vector<uint32_t> ids;
    if (int rc = share_range(ctx, addr, len, &ids, verb)) return rc;
    for (uint32_t id : ids) {
        const Segment& s = ctx.segments.segs.at(id);
        note_shared(mr, s.gva, s.gva + s.len);
        mr.segments.push_back(id);
    }
    return 0;
}

// The fault itself: the window around the range if it all can be shared,
// else the range alone (with a message if that cannot be either).
int fault_in(Context& ctx, Mr& mr, uintptr_t addr, uint64_t len) {
    for (const MapEntry& e : read_maps(false)) {
        if (e.end <= addr) continue;
        if (e.start > addr || addr + len > e.end) break;  // not one mapping: the range alone
        uintptr_t lo = std::max<uintptr_t>(addr & ~(kFaultWindow - 1), uintptr_t(mr.vmr.ibv_mr.addr));
        uintptr_t hi = (addr + len + kFaultWindow - 1) & ~(kFaultWindow - 1);
        if (hi < addr) hi = UINTPTR_MAX;  // the last window of the address space
        lo = std::max(lo, e.start);
        hi = std::min({hi, mr_end(mr), e.end});
        if (hi - lo > len && share_for(ctx, mr, lo, hi - lo, nullptr) == 0 && covered(mr, addr, len)) return 0;
        break;
    }
    return share_for(ctx, mr, addr, len, "an on-demand access");
}

Mr* odp_mr(Context& ctx, uint32_t lkey) {
    auto it = ctx.odp_mrs.find(lkey);
    return it == ctx.odp_mrs.end() ? nullptr : it->second;
}

bool inside(const Mr& mr, uintptr_t addr, uint64_t len) {
    return addr >= uintptr_t(mr.vmr.ibv_mr.addr) && addr + len >= addr && addr + len <= mr_end(mr);
}

}  // namespace

ibv_mr* register_on_demand(ibv_pd* pd, uintptr_t addr, size_t length, uint64_t iova, int access) {
    const bool implicit = implicit_range(addr, length);
    if (!implicit && addr + length < addr) {
        errno = EINVAL;
        return nullptr;
    }
    // All there now: shared now, as any MR (remote peers reach all of it).
    if (!implicit && all_mapped(addr, length)) return register_memory(pd, addr, length, iova, access, nullptr);
    // Pages shared later are named by their own addresses.
    if (iova != addr) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    return register_memory(pd, addr, length, iova, access, nullptr, true);
}

void track_odp(Context& ctx, Mr& mr, bool on_demand) {
    mr.on_demand = on_demand;
    ctx.odp_mrs[mr.vmr.ibv_mr.lkey] = &mr;
    if (on_demand) ctx.on_demand_mrs.fetch_add(1, std::memory_order_release);
}

void untrack_odp(Context& ctx, Mr& mr) {
    auto it = ctx.odp_mrs.find(mr.vmr.ibv_mr.lkey);
    if (it == ctx.odp_mrs.end() || it->second != &mr) return;
    ctx.odp_mrs.erase(it);
    if (mr.on_demand) ctx.on_demand_mrs.fetch_sub(1, std::memory_order_release);
}

void fault_in_sges(Context& ctx, const ibv_sge* list, size_t n) {
    if (ctx.on_demand_mrs.load(std::memory_order_acquire) == 0) return;
    std::lock_guard lock(ctx.mem_mu);
    for (size_t i = 0; i < n; ++i) {
        const ibv_sge& s = list[i];
        if (s.length == 0) continue;
        Mr* mr = odp_mr(ctx, s.lkey);
        if (!mr || !mr->on_demand || !inside(*mr, s.addr, s.length) || covered(*mr, s.addr, s.length)) continue;
        fault_in(ctx, *mr, s.addr, s.length);
    }
}

int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge) {
    if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
        advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
        return EOPNOTSUPP;
    if ((flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH)) || num_sge == 0 || !sg_list) return EINVAL;
    Context& ctx = ctx_of(pd->context);
    std::lock_guard lock(ctx.mem_mu);
    // Every SGE names an ODP MR of this PD (a parent domain names its
    // protection domain's handle) and lies inside it; checked before any
    // page moves.
    for (uint32_t i = 0; i < num_sge; ++i) {
        const ibv_sge& s = sg_list[i];
        const Mr* mr = odp_mr(ctx, s.lkey);
        if (!mr || !inside(*mr, s.addr, s.length) || mr->vmr.ibv_mr.pd->handle != pd->handle) return EINVAL;
    }
    for (uint32_t i = 0; i < num_sge; ++i) {
        const ibv_sge& s = sg_list[i];
        Mr* mr = odp_mr(ctx, s.lkey);
        // An ODP MR shared at registration has nothing left to fetch.
        if (!mr->on_demand || s.length == 0 || covered(*mr, s.addr, s.length)) continue;
        // NO_FAULT maps what is there and never fails for what is not.
        int rc = fault_in(ctx, *mr, s.addr, s.length);
        if (rc && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) return EFAULT;
    }
    return 0;
}

}  // namespace vrdma::prov
