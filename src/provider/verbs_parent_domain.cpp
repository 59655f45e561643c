// Parent domains (ibv_alloc_parent_domain): a protection domain with a
// context pointer and memory allocators attached.
//
// The allocators are kept but never called: a vrdma queue's memory is a
// ring in the arena the shim maps (docs/protocol.md), which the
// application's memory could not be; ibv_alloc_parent_domain(3) lets a
// provider allocate as it would by default, which is what an allocator
// returning IBV_ALLOCATOR_USE_DEFAULT asks for. Thread domains are not
// offered, so a parent domain has none.
#include <cerrno>
#include <new>

#include "objects.h"
#include "verbs.h"

namespace vrdma::prov {

ibv_pd* alloc_parent_domain(ibv_context* ibctx, ibv_parent_domain_init_attr* attr) {
    constexpr uint32_t kKnown = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if (!attr || !attr->pd || attr->pd->context != ibctx || attr->td || (attr->comp_mask & ~kKnown)) {
        errno = EINVAL;
        return nullptr;
    }
    if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) && (!attr->alloc || !attr->free)) {
        errno = EINVAL;
        return nullptr;
    }
    Pd* protection = to_pd(attr->pd);
    if (protection->protection) {  // a parent domain is over a protection domain, not another parent
        errno = EINVAL;
        return nullptr;
    }
    Pd* pd = new_pd(ibctx, attr->pd->handle, protection);
    if (!pd) return nullptr;
    protection->parent_domains.fetch_add(1);
    return &pd->ibv;
}

bool is_parent_domain(ibv_context* ibctx, ibv_pd* pd) {
    return pd && pd->context == ibctx && to_pd(pd)->protection != nullptr;
}

}  // namespace vrdma::prov
