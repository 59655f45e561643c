// ibv_import_device, ibv_import_pd and ibv_import_mr (ibv_import_dm is in
// verbs_dm.cpp, next to device memory).
//
// On a kernel device a context is an open uverbs file: ibv_import_device
// makes a second ibv_context over the same file from a duplicate of its
// command fd, and the two share every object, named by handle. A vrdma
// context is a connection to the shim with its arena, rings and memory
// segments; its command fd is an open /dev/null that carries nothing. So an
// import is a second ibv_context over the same provider state (Context),
// found by asking the kernel (kcmp) which open context's command fd is the
// same open file as the one given. That state lives in the process that
// opened the device: a vrdma context can be imported there only, and only
// when this library is preloaded (vrdma-run does it), because libibverbs'
// own ibv_import_device asks the kernel for an async event fd on the
// command fd, which /dev/null cannot answer.
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "context.h"
#include "events.h"
#include "import.h"
#include "objects.h"
#include "on_demand.h"
#include "verbs.h"
#include "vrdma_common/log.h"

namespace vrdma::prov {

ImportRequest* as_import_request(void* private_data) {
    auto* req = static_cast<ImportRequest*>(private_data);
    return req && req->magic == ImportRequest::kMagic ? req : nullptr;
}

verbs_context* import_context(ibv_device*, int cmd_fd) {
    LOG_ERR("ibv_import_device(%d): not the command fd of a vrdma context this process opened with "
            "the provider preloaded; a vrdma context can be imported only there (vrdma-run preloads it)",
            cmd_fd);
    errno = EOPNOTSUPP;
    return nullptr;
}

// As the kernel, a PD or MR is imported by its handle, into any context
// over the same state; a handle that names nothing is EINVAL.
ibv_pd* import_pd(ibv_context* ibctx, uint32_t handle) {
    Context& ctx = ctx_of(ibctx);
    {
        std::lock_guard lock(ctx.mem_mu);
        if (!ctx.pd_handles.count(handle)) {
            errno = EINVAL;
            return nullptr;
        }
    }
    Pd* pd = new_pd(ibctx, handle);
    return pd ? &pd->ibv : nullptr;
}

// Frees what the import made; the PD stays (ibv_dealloc_pd frees it,
// through any of its imports).
void unimport_pd(ibv_pd* ibpd) {
    Pd* pd = to_pd(ibpd);
    if (pd->protection) pd->protection->parent_domains.fetch_sub(1);
    delete pd;
}

// The import holds its own references on the MR's memory segments, so
// either the MR or its import may go first.
ibv_mr* import_mr(ibv_pd* pd, uint32_t handle) {
    Context& ctx = ctx_of(pd->context);
    std::lock_guard lock(ctx.mem_mu);
    auto it = ctx.mrs.find(handle);
    if (it == ctx.mrs.end()) {
        errno = EINVAL;
        return nullptr;
    }
    const Mr& from = *it->second;
    if (from.vmr.access & IBV_ACCESS_ON_DEMAND) {
        // Its faults are served through the MR as registered (on_demand.h).
        LOG_ERR("ibv_import_mr: MR %u is on-demand (IBV_ACCESS_ON_DEMAND); importing one is not supported",
                handle);
        errno = EOPNOTSUPP;
        return nullptr;
    }
    auto* mr = new (std::nothrow) Mr{};
    if (!mr) {
        errno = ENOMEM;
        return nullptr;
    }
    mr->vmr = from.vmr;
    mr->vmr.ibv_mr.context = pd->context;
    mr->vmr.ibv_mr.pd = pd;
    mr->vmr.ibv_mr.addr = nullptr;  // as ibv_import_mr(3) says: not applicable
    mr->handle = from.handle;
    mr->segments = from.segments;
    retain_segments(ctx, mr->segments);
    mr->dm = from.dm;
    if (mr->dm) dm_mr_made(mr->dm);
    return &mr->vmr.ibv_mr;
}

void unimport_mr(ibv_mr* ibmr) {
    Mr* mr = to_mr(reinterpret_cast<verbs_mr*>(ibmr));
    Context& ctx = ctx_of(ibmr->context);
    std::lock_guard lock(ctx.mem_mu);
    auto it = ctx.mrs.find(mr->handle);
    if (it != ctx.mrs.end() && it->second == mr) {  // the MR as registered, not an import of it
        ctx.mrs.erase(it);
        untrack_odp(ctx, *mr);
    }
    release_segments(ctx, mr->segments);
    if (mr->dm) dm_mr_gone(mr->dm);
    delete mr;
}

}  // namespace vrdma::prov

using namespace vrdma;
using namespace vrdma::prov;

// Preloaded for the whole process, as the completion channel entry points
// (events.h). An fd that is no vrdma context's goes to libibverbs' own
// ibv_import_device (another device's, or a vrdma context's of another
// process, which import_context refuses with a message).
extern "C" [[gnu::visibility("default")]] ibv_context* ibv_import_device(int cmd_fd) {
    ImportRequest req;
    req.cmd_fd = cmd_fd;
    ibv_device* device = nullptr;
    req.ctx = claim_context_of_cmd_fd(cmd_fd, &device, &req.async_fd);
    if (!req.ctx) {
        if (errno != ENOENT)
            LOG_WARN("ibv_import_device(%d): kcmp cannot compare it with this process's vrdma contexts: %s",
                     cmd_fd, std::strerror(errno));
        auto fn = reinterpret_cast<ibv_context* (*)(int)>(::dlsym(RTLD_NEXT, "ibv_import_device"));
        if (!fn) {
            errno = ENOSYS;
            return nullptr;
        }
        return fn(cmd_fd);
    }
    ibv_context* ibctx = verbs_open_device(device, &req);
    if (!ibctx && !req.taken) {  // a context that was made gave all back when it was closed
        const int e = errno;
        if (req.async_fd >= 0) ::close(req.async_fd);
        if (req.ctx->users.fetch_sub(1) == 1) delete req.ctx;
        errno = e;
    }
    return ibctx;
}
