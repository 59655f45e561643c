// Device memory (ibv_alloc_dm, ibv_memcpy_to_dm, ibv_memcpy_from_dm,
// ibv_reg_dm_mr; docs/protocol.md "Device memory"). An HCA's device memory
// is on-chip memory the host reaches over PCI; vrdma's is a memfd the
// provider maps, so the application's copies are plain loads and stores.
// The shim learns of it when an MR is made over it (ibv_reg_dm_mr shares
// it as any shared mapping, memory_registration.h), so allocating needs
// no command: a process forked from the one that opened the device may
// allocate too, as rdma-core's suite does. It is the guest's own memory
// (its memory cgroup pays for it), up to kMaxDmBytes per context and
// process. MRs over it are zero-based: work requests name its bytes from
// 0, as on mlx5.
#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "context.h"
#include "memory_registration.h"
#include "objects.h"
#include "verbs.h"
#include "vrdma_common/log.h"

namespace vrdma::prov {

struct Dm {
    ibv_dm ibv;
    UniqueFd fd;        // open while it lives: registration finds the mapping's file by it
    uint8_t* base = nullptr;
    size_t length = 0;  // what the application asked for
    size_t mapped = 0;  // page multiple
    uint32_t mrs = 0;   // live MRs over it (under the context's mem_mu)
    bool shared = false;  // an MR was made over it: the shim has its segment
    bool imported = false;  // ibv_import_dm: another mapping of a context's device memory
};

namespace {

Dm* to_dm(ibv_dm* d) { return reinterpret_cast<Dm*>(d); }
static_assert(std::is_standard_layout_v<Dm> && offsetof(Dm, ibv) == 0);

// As on mlx5, the only device with device memory: copies start and end on
// 4-byte boundaries (the suite and applications written for it expect
// unaligned ones to fail), inside the allocation.
bool copy_ok(const Dm& dm, uint64_t offset, size_t length) {
    return offset % 4 == 0 && length % 4 == 0 && offset <= dm.length && length <= dm.length - offset;
}

int memcpy_to_dm(ibv_dm* d, uint64_t offset, const void* host, size_t length) {
    Dm* dm = to_dm(d);
    if (!copy_ok(*dm, offset, length)) return EINVAL;
    std::memcpy(dm->base + offset, host, length);
    return 0;
}

int memcpy_from_dm(void* host, ibv_dm* d, uint64_t offset, size_t length) {
    Dm* dm = to_dm(d);
    if (!copy_ok(*dm, offset, length)) return EINVAL;
    std::memcpy(host, dm->base + offset, length);
    return 0;
}

void init_ibv_dm(Dm& dm, ibv_context* ibctx, uint32_t handle) {
    dm.ibv.context = ibctx;
    dm.ibv.memcpy_to_dm = memcpy_to_dm;
    dm.ibv.memcpy_from_dm = memcpy_from_dm;
    dm.ibv.comp_mask = 0;
    dm.ibv.handle = handle;
}

// Unmaps it (the caller holds mem_mu and checked that no MR is over it).
void unmap_dm(Context& ctx, Dm* dm) {
    ::munmap(dm->base, dm->mapped);
    if (dm->shared) forget_unmapped_segments(ctx);  // the shim lets go of that mapping too
    if (!dm->imported) ctx.dm_bytes -= dm->mapped;
    delete dm;
}

}  // namespace

ibv_dm* alloc_dm(ibv_context* ibctx, ibv_alloc_dm_attr* attr) {
    Context& ctx = ctx_of(ibctx);
    // log_align_req: a memfd mapping is page aligned, so any alignment up
    // to a page is met.
    if (!attr || attr->comp_mask != 0 || attr->length == 0 || attr->log_align_req > 12) {
        errno = EINVAL;
        return nullptr;
    }
    if (attr->length > kMaxDmBytes) {
        errno = ENOMEM;
        return nullptr;
    }
    auto* dm = new (std::nothrow) Dm{};
    if (!dm) {
        errno = ENOMEM;
        return nullptr;
    }
    dm->length = attr->length;
    dm->mapped = (attr->length + abi::kPageSize - 1) & ~size_t(abi::kPageSize - 1);
    std::lock_guard lock(ctx.mem_mu);
    if (ctx.dm_bytes + dm->mapped > kMaxDmBytes) {
        delete dm;
        errno = ENOMEM;
        return nullptr;
    }
    if (int rc = create_shared_memfd("vrdma-dm", dm->mapped, dm->fd)) {
        delete dm;
        errno = rc;
        return nullptr;
    }
    void* base = ::mmap(nullptr, dm->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, dm->fd.get(), 0);
    if (base == MAP_FAILED) {
        const int e = errno;
        delete dm;
        errno = e;
        return nullptr;
    }
    ctx.dm_bytes += dm->mapped;
    dm->base = static_cast<uint8_t*>(base);
    const uint32_t handle = ctx.next_dm_handle++;
    init_ibv_dm(*dm, ibctx, handle);
    ctx.dms[handle] = dm;  // what ibv_import_dm may name
    return &dm->ibv;
}

// ibv_import_dm: a second mapping of the same memfd, so that either the
// device memory or its import may go first.
ibv_dm* import_dm(ibv_context* ibctx, uint32_t handle) {
    Context& ctx = ctx_of(ibctx);
    std::lock_guard lock(ctx.mem_mu);
    auto it = ctx.dms.find(handle);
    if (it == ctx.dms.end()) {
        errno = EINVAL;
        return nullptr;
    }
    const Dm& from = *it->second;
    auto* dm = new (std::nothrow) Dm{};
    if (!dm) {
        errno = ENOMEM;
        return nullptr;
    }
    dm->fd.reset(::fcntl(from.fd.get(), F_DUPFD_CLOEXEC, 0));
    void* base = dm->fd ? ::mmap(nullptr, from.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, dm->fd.get(), 0)
                        : MAP_FAILED;
    if (base == MAP_FAILED) {
        const int e = errno;
        delete dm;
        errno = e;
        return nullptr;
    }
    dm->base = static_cast<uint8_t*>(base);
    dm->length = from.length;
    dm->mapped = from.mapped;
    dm->imported = true;
    init_ibv_dm(*dm, ibctx, handle);
    return &dm->ibv;
}

void unimport_dm(ibv_dm* d) {
    Dm* dm = to_dm(d);
    Context& ctx = ctx_of(d->context);
    std::lock_guard lock(ctx.mem_mu);
    if (dm->mrs) {  // the MRs over it still use this mapping: it stays until the context goes
        LOG_WARN("ibv_unimport_dm: %u MRs are still over the imported device memory; it stays mapped", dm->mrs);
        return;
    }
    auto it = ctx.dms.find(d->handle);
    if (it != ctx.dms.end() && it->second == dm) ctx.dms.erase(it);
    unmap_dm(ctx, dm);
}

// The memory goes once no MR is over it (EBUSY while one is, as the
// kernel refuses to free device memory in use).
int free_dm(ibv_dm* d) {
    Dm* dm = to_dm(d);
    Context& ctx = ctx_of(d->context);
    std::lock_guard lock(ctx.mem_mu);
    if (dm->mrs) return EBUSY;
    ctx.dms.erase(d->handle);  // freed through it or an import of it: no more imports
    unmap_dm(ctx, dm);
    return 0;
}

ibv_mr* reg_dm_mr(ibv_pd* pd, ibv_dm* d, uint64_t offset, size_t length, unsigned int access) {
    Dm* dm = to_dm(d);
    if (!(access & IBV_ACCESS_ZERO_BASED) || d->context != pd->context || offset > dm->length ||
        length > dm->length - offset) {
        LOG_DEBUG("ibv_reg_dm_mr: offset %llu and length %zu in %zu bytes of device memory, access %#x: "
                  "refused (zero-based access and a range inside the allocation are required)",
                  (unsigned long long)offset, length, dm->length, access);
        errno = EINVAL;
        return nullptr;
    }
    return register_memory(pd, reinterpret_cast<uintptr_t>(dm->base + offset), length, 0, int(access), dm);
}

// Under the context's mem_mu, with the registration itself: ibv_free_dm
// never sees an MR half made.
void dm_mr_made(Dm* dm) {
    ++dm->mrs;
    dm->shared = true;
}

void dm_mr_gone(Dm* dm) { --dm->mrs; }

}  // namespace vrdma::prov
