// Completion queues: creation, polling, arming.
#include <sched.h>

#include <cerrno>
#include <new>

#include "context.h"
#include "events.h"
#include "objects.h"
#include "verbs.h"
#include "vm_events.h"
#include "vrdma/ring.h"

namespace vrdma::prov {

namespace {
uint32_t pow2_at_least(uint64_t v) {
    uint64_t p = 1;
    while (p < v) p <<= 1;
    return p > UINT32_MAX ? 0 : uint32_t(p);
}

// Inside a VM: where the ring stands at an arming. The count first: a
// completion that lands between the two reads is then counted as after
// the arming (an event too many, never one too few).
void take_vm_arm_mark(Cq& cq) {
    cq.vm_arm_produced = cq.hdr->produced.load(std::memory_order_acquire);
    cq.vm_arm_prod = cq.hdr->producer.load(std::memory_order_acquire);
}
}  // namespace

namespace {

struct CqCreate {
    int cqe;
    ibv_comp_channel* channel;
    int comp_vector;
    uint32_t flags = 0;  // abi::kCqTimestamps
};

// Both creation verbs: the ring, the shim's CQ. The caller fills in what
// libibverbs would (ibv_create_cq) or what it leaves to the provider
// (ibv_create_cq_ex).
Cq* create_common(ibv_context* ibctx, const CqCreate& c) {
    Context& ctx = ctx_of(ibctx);
    if (c.cqe < 1 || uint32_t(c.cqe) > ctx.dev_attr.max_cqe || c.comp_vector < 0 ||
        c.comp_vector >= ibctx->num_comp_vectors) {
        errno = EINVAL;
        return nullptr;
    }
    uint32_t channel_id = 0;
    int vm_channel_fd = -1;
    if (c.channel) {
        // Only a channel this library made for this context (events.h);
        // a kernel channel could never be written by the shim.
        channel_id = channel_id_of(c.channel, ctx);
        if (!channel_id) {
            errno = EINVAL;
            return nullptr;
        }
        // Inside a VM the process writes the channel itself (vm_events.h).
        if (ctx.in_vm) {
            vm_channel_fd = vm_channel_write_fd(c.channel, ctx);
            channel_id = 0;
        }
    }
    uint32_t entries = pow2_at_least(uint64_t(c.cqe) + 1);
    if (entries == 0 || entries > abi::kMaxCqEntries) {
        errno = EINVAL;
        return nullptr;
    }
    auto* cq = new (std::nothrow) Cq{};
    if (!cq) {
        errno = ENOMEM;
        return nullptr;
    }
    cq->ctx = &ctx;
    cq->entries = entries;
    cq->vm_channel_fd = vm_channel_fd;
    cq->mem = alloc_ring(ctx, abi::cq_ring_bytes(entries));
    if (!cq->mem) {
        int e = errno;
        delete cq;
        errno = e;
        return nullptr;
    }
    auto* base = static_cast<uint8_t*>(cq->mem);
    cq->hdr = reinterpret_cast<abi::RingHeader*>(base);
    cq->notify = reinterpret_cast<abi::CqNotify*>(base + sizeof(abi::RingHeader));
    cq->cqes = reinterpret_cast<abi::Cqe*>(base + abi::cq_slots_offset());

    abi::CmdCreateCqReq req{};
    req.ring_gva = reinterpret_cast<uintptr_t>(cq->mem);
    req.user_handle = reinterpret_cast<uintptr_t>(&cq->vcq.cq);
    req.entries = entries;
    req.channel_id = channel_id;
    req.comp_vector = uint32_t(c.comp_vector);
    req.flags = c.flags;
    abi::CmdCreateCqResp resp{};
    if (int rc = command(ctx, abi::CmdOp::CreateCq, &req, sizeof(req), &resp, sizeof(resp))) {
        free_ring(ctx, cq->mem);
        delete cq;
        errno = rc;
        return nullptr;
    }
    cq->handle = resp.cq_handle;
    ibv_cq& ib = cq->vcq.cq;
    ib.context = ibctx;
    ib.handle = resp.cq_handle;
    ib.cqe = int(entries - 1);
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_cqs.insert(&ib);
    return cq;
}

}  // namespace

ibv_cq* create_cq(ibv_context* ibctx, int cqe, ibv_comp_channel* channel, int comp_vector) {
    Cq* cq = create_common(ibctx, CqCreate{cqe, channel, comp_vector});
    return cq ? &cq->vcq.cq : nullptr;
}

ibv_cq_ex* create_cq_ex(ibv_context* ibctx, ibv_cq_init_attr_ex* attr) {
    if (attr->comp_mask & ~uint32_t(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) {
        errno = EINVAL;
        return nullptr;
    }
    // Single-threaded use is a hint (polling is locked anyway); ignoring
    // overruns is not offered. A parent domain adds nothing to a CQ here
    // (its allocators are not called: verbs_parent_domain.cpp), but it
    // must be one.
    uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
    if ((flags & ~uint32_t(IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) || (attr->wc_flags & ~kCqExWcFlags)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) && !is_parent_domain(ibctx, attr->parent_domain)) {
        errno = EINVAL;
        return nullptr;
    }
    if (attr->cqe > uint32_t(INT32_MAX)) {
        errno = EINVAL;
        return nullptr;
    }
    constexpr uint64_t kStamps =
        uint64_t(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    // A completion holds the stamps or the tag-matching fields (abi::Cqe).
    if ((attr->wc_flags & kStamps) && (attr->wc_flags & IBV_WC_EX_WITH_TM_INFO)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    const uint32_t cq_flags = (attr->wc_flags & kStamps) ? abi::kCqTimestamps : 0;
    Cq* cq = create_common(ibctx, CqCreate{int(attr->cqe), attr->channel, int(attr->comp_vector), cq_flags});
    if (!cq) return nullptr;
    // libibverbs fills in the channel, the CQ context and the event counts,
    // and counts the CQ on its channel, once this returns (as after
    // ibv_create_cq): doing it here too left the channel busy for ever.
    install_cq_ex_ops(*cq);
    return &cq->vcq.cq_ex;
}

int destroy_cq(ibv_cq* ibcq) {
    Cq* cq = to_cq(ibcq);
    Context& ctx = *cq->ctx;
    abi::CmdHandleReq req{cq->handle};
    abi::CmdDestroyResp resp{};
    int rc = command(ctx, abi::CmdOp::DestroyCq, &req, sizeof(req), &resp, sizeof(resp));
    if (rc && rc != EIO) return rc;
    if (rc == 0) free_ring(ctx, cq->mem);  // shim gone: it may still map it, keep it
    // Inside a VM the records are the event thread's, not the shim's.
    if (ctx.in_vm && cq->vm_channel_fd >= 0) resp.comp_events = vm_events_forget(ctx, *cq);
    bool zombie = retire_cq(ctx, *cq, rc == 0 ? &resp : nullptr);
    // As with a kernel device: every event handed to the application must
    // be acknowledged before the CQ goes away.
    uint32_t comp, async;
    {
        std::lock_guard lock(ctx.ev_mu);
        comp = cq->comp_read;
        async = cq->async_read;
    }
    wait_acked(&ibcq->mutex, &ibcq->cond, &ibcq->comp_events_completed, comp, &ibcq->async_events_completed,
               async);
    if (zombie)
        keep_zombie(ctx, cq);
    else
        delete cq;
    return 0;
}

int poll_cq(ibv_cq* ibcq, int num_entries, ibv_wc* wc) {
    Cq* cq = to_cq(ibcq);
    int n = 0;
    {
        std::lock_guard lock(cq->mu);
        uint32_t cons = cq->cons;
        while (n < num_entries && cq->cqe_ready(cons)) {
            const abi::Cqe& e = cq->cqes[ring_slot(cons, cq->entries)];
            ibv_wc& w = wc[n];
            w.wr_id = e.wr_id;
            w.status = static_cast<ibv_wc_status>(e.status);
            w.opcode = static_cast<ibv_wc_opcode>(e.opcode);
            w.vendor_err = e.vendor_err;
            w.byte_len = e.byte_len;
            w.imm_data = e.imm_data;
            w.qp_num = e.qp_num;
            w.src_qp = e.src_qp;
            w.wc_flags = e.wc_flags;
            w.pkey_index = e.pkey_index;
            w.slid = e.slid;
            w.sl = e.sl;
            w.dlid_path_bits = e.dlid_path_bits;
            cons = ring_next(cons, cq->entries);
            ++n;
        }
        if (n) {
            cq->consume_to(cons);
            cq->empty_polls = 0;
            return n;
        }
        if (cq->empty_polls < cq->ctx->poll_spin) {
            ++cq->empty_polls;
            return 0;
        }
    }
    return cq_idle(*cq) ? 0 : -1;
}

bool cq_idle(Cq& cq) {
    // An idle poller gives the CPU to the shim and the peer (cores are
    // shared). Now and then it also checks that the shim is still there: a
    // poller waiting for completions that can no longer come gets an error.
    if ((++cq.idle_polls & 255) == 0 && shim_lost(*cq.ctx)) return false;
    sched_yield();
    return true;
}

void discard_completions(Cq& cq, uint32_t qp_num, bool receives) {
    std::lock_guard lock(cq.mu);
    // The shim only ever writes at the producer index and beyond, so the
    // completions between the consumer and the producer read now stay put
    // while the kept ones slide towards the producer over the dropped ones.
    const uint32_t prod = cq.hdr->producer.load(std::memory_order_acquire);
    if (!ring_valid_producer(prod, cq.cons, cq.entries)) return;
    const uint32_t n = ring_count(prod, cq.cons, cq.entries);
    uint32_t dropped = 0;
    for (uint32_t k = n; k-- > 0;) {
        const uint32_t idx = ring_advance(cq.cons, k, cq.entries);
        const abi::Cqe& e = cq.cqes[ring_slot(idx, cq.entries)];
        const bool receive = (e.opcode & IBV_WC_RECV) != 0;
        if (e.qp_num == qp_num && (receives || !receive)) {
            ++dropped;
        } else if (dropped) {
            // It moves to another index, perhaps in the other lap: the
            // owner bit of its new place.
            const uint32_t to = ring_advance(idx, dropped, cq.entries);
            abi::Cqe& moved = cq.cqes[ring_slot(to, cq.entries)];
            moved = e;
            moved.flags = abi::cqe_flags_at(moved.flags, to, cq.entries);
        }
    }
    if (!dropped) return;
    cq.consume_to(ring_advance(cq.cons, dropped, cq.entries));
}

int resize_cq(ibv_cq* ibcq, int cqe) {
    Cq* cq = to_cq(ibcq);
    Context& ctx = *cq->ctx;
    if (cqe < 1 || uint32_t(cqe) > ctx.dev_attr.max_cqe) return EINVAL;
    uint32_t entries = pow2_at_least(uint64_t(cqe) + 1);
    if (entries == 0 || entries > abi::kMaxCqEntries) return EINVAL;
    // No poll and no arming while the shim moves the completions.
    std::lock_guard lock(cq->mu);
    std::lock_guard arm_lock(cq->arm_mu);
    void* mem = alloc_ring(ctx, abi::cq_ring_bytes(entries));
    if (!mem) return errno;
    abi::CmdResizeCqReq req{};
    req.ring_gva = reinterpret_cast<uintptr_t>(mem);
    req.cq_handle = cq->handle;
    req.entries = entries;
    req.cqe = uint32_t(cqe);
    abi::CmdResizeCqResp resp{};
    if (int rc = command(ctx, abi::CmdOp::ResizeCq, &req, sizeof(req), &resp, sizeof(resp))) {
        free_ring(ctx, mem);
        return rc;
    }
    free_ring(ctx, cq->mem);
    auto* base = static_cast<uint8_t*>(mem);
    cq->mem = mem;
    cq->hdr = reinterpret_cast<abi::RingHeader*>(base);
    cq->notify = reinterpret_cast<abi::CqNotify*>(base + sizeof(abi::RingHeader));
    cq->cqes = reinterpret_cast<abi::Cqe*>(base + abi::cq_slots_offset());
    cq->entries = entries;
    cq->cons = 0;
    cq->vm_event_pending.store(false, std::memory_order_relaxed);  // indices start anew
    take_vm_arm_mark(*cq);
    ibcq->cqe = int(entries - 1);
    return 0;
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) {
    Cq* cq = to_cq(ibcq);
    if (cq->ctx->dead.load(std::memory_order_relaxed)) return EIO;
    // Not cq->mu: a poller may hold that between start_poll and end_poll
    // and arm the CQ meanwhile.
    {
        std::lock_guard lock(cq->arm_mu);  // the ring may be replaced by resize_cq
        cq->notify->arm_solicited.store(solicited_only ? 1 : 0, std::memory_order_relaxed);
        cq->notify->arm_seq.fetch_add(1, std::memory_order_release);
        ring_doorbell(*cq->ctx);
        if (cq->vm_channel_fd >= 0 && !cq->vm_armed) {  // a second arming changes nothing
            cq->vm_armed = true;
            take_vm_arm_mark(*cq);
        }
    }
    if (cq->vm_channel_fd >= 0) vm_events_arm(*cq->ctx, *cq, solicited_only != 0);
    return 0;
}

}  // namespace vrdma::prov
