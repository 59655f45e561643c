// Completion queues: creation, polling, arming.
#include <sched.h>

#include <cerrno>
#include <new>

#include "context.h"
#include "events.h"
#include "objects.h"
#include "verbs.h"
#include "vrdma/ring.h"

namespace vrdma::prov {

namespace {
uint32_t pow2_at_least(uint64_t v) {
    uint64_t p = 1;
    while (p < v) p <<= 1;
    return p > UINT32_MAX ? 0 : uint32_t(p);
}
}  // namespace

ibv_cq* create_cq(ibv_context* ibctx, int cqe, ibv_comp_channel* channel, int comp_vector) {
    Context& ctx = ctx_of(ibctx);
    if (cqe < 1 || uint32_t(cqe) > ctx.dev_attr.max_cqe) {
        errno = EINVAL;
        return nullptr;
    }
    uint32_t channel_id = 0;
    if (channel) {
        // Only a channel this library made for this context (events.h);
        // a kernel channel could never be written by the shim.
        channel_id = channel_id_of(channel, ctx);
        if (!channel_id) {
            errno = EINVAL;
            return nullptr;
        }
    }
    uint32_t entries = pow2_at_least(uint64_t(cqe) + 1);
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
    req.comp_vector = uint32_t(comp_vector);
    abi::CmdCreateCqResp resp{};
    if (int rc = command(ctx, abi::CmdOp::CreateCq, &req, sizeof(req), &resp, sizeof(resp))) {
        free_ring(ctx, cq->mem);
        delete cq;
        errno = rc;
        return nullptr;
    }
    cq->handle = resp.cq_handle;
    ibv_cq& c = cq->vcq.cq;
    c.context = ibctx;
    c.handle = resp.cq_handle;
    c.cqe = int(entries - 1);
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_cqs.insert(&c);
    return &c;
}

int destroy_cq(ibv_cq* ibcq) {
    Cq* cq = to_cq(ibcq);
    Context& ctx = *cq->ctx;
    abi::CmdHandleReq req{cq->handle};
    abi::CmdDestroyResp resp{};
    int rc = command(ctx, abi::CmdOp::DestroyCq, &req, sizeof(req), &resp, sizeof(resp));
    if (rc && rc != EIO) return rc;
    if (rc == 0) free_ring(ctx, cq->mem);  // shim gone: it may still map it, keep it
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
        uint32_t prod = cq->hdr->producer.load(std::memory_order_acquire);
        if (!ring_valid_producer(prod, cq->cons, cq->entries)) return -1;
        uint32_t cons = cq->cons;
        while (n < num_entries && cons != prod) {
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
            cq->cons = cons;
            cq->hdr->consumer.store(cons, std::memory_order_release);
            cq->empty_polls = 0;
            return n;
        }
        if (cq->empty_polls < cq->ctx->poll_spin) {
            ++cq->empty_polls;
            return 0;
        }
    }
    // An idle poller gives the CPU to the shim and the peer (cores are
    // shared). Now and then it also checks that the shim is still there: a
    // poller waiting for completions that can no longer come gets an error.
    if ((++cq->idle_polls & 255) == 0 && shim_lost(*cq->ctx)) return -1;
    sched_yield();
    return 0;
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) {
    Cq* cq = to_cq(ibcq);
    if (cq->ctx->dead.load(std::memory_order_relaxed)) return EIO;
    cq->notify->arm_solicited.store(solicited_only ? 1 : 0, std::memory_order_relaxed);
    cq->notify->arm_seq.fetch_add(1, std::memory_order_release);
    ring_doorbell(*cq->ctx);
    return 0;
}

}  // namespace vrdma::prov
