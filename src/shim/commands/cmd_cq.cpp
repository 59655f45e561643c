// CreateCq, DestroyCq, ResizeCq.
#include <cerrno>
#include <cstring>

#include "commands.h"
#include "cq_events.h"
#include "requester.h"
#include "vrdma/ring.h"

namespace vrdma::shim {

int cmd_create_cq(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdCreateCqReq>(req);
    if (!is_pow2(r.entries) || r.entries > abi::kMaxCqEntries || r.entries - 1 > ctx.quotas().max_cqe)
        return EINVAL;
    if (r.comp_vector >= abi::kCompVectors || (r.flags & ~abi::kCqTimestamps)) return EINVAL;
    HostRange ring;
    if (int err = map_ring(ctx, r.ring_gva, abi::cq_ring_bytes(r.entries), ring)) return err;
    if (r.channel_id && !ctx.has_channel(r.channel_id)) return EINVAL;
    PendingCharges charge(ctx);
    if (!charge.take(Res::Cq, 1, "CreateCq")) return ENOMEM;
    auto cq = std::make_unique<Cq>();
    cq->ring = reinterpret_cast<abi::RingHeader*>(ring.host);
    cq->notify = reinterpret_cast<abi::CqNotify*>(ring.host + sizeof(abi::RingHeader));
    cq->slots = reinterpret_cast<abi::Cqe*>(ring.host + abi::cq_slots_offset());
    cq->entries = r.entries;
    cq->user_handle = r.user_handle;
    cq->channel_id = r.channel_id;
    cq->timestamps = (r.flags & abi::kCqTimestamps) != 0;
    cq->keep = std::move(ring.keepalive);
    cq->last_arm_seq = cq->notify->arm_seq.load(std::memory_order_acquire);
    cq->ring->produced.store(0, std::memory_order_relaxed);
    cq->ring->producer.store(0, std::memory_order_release);
    uint32_t h = ctx.cqs.insert(std::move(cq));
    if (!h) return ENOMEM;
    charge.keep();
    store_resp(resp, abi::CmdCreateCqResp{h});
    return 0;
}

int cmd_destroy_cq(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Cq* cq = ctx.cqs.get(r.handle);
    if (!cq) return ENOENT;
    if (cq->users) return EBUSY;
    store_resp(resp, abi::CmdDestroyResp{cq->comp_events, cq->async_events});
    ctx.cqs.erase(r.handle);
    ctx.charges.give(Res::Cq, 1);
    return 0;
}

int cmd_resize_cq(Engine& eng, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdResizeCqReq>(req);
    Cq* cq = ctx.cqs.get(r.cq_handle);
    if (!cq) return EINVAL;
    if (!is_pow2(r.entries) || r.entries > abi::kMaxCqEntries || r.entries - 1 > ctx.quotas().max_cqe ||
        r.cqe == 0 || r.cqe > r.entries - 1)
        return EINVAL;
    if (cq->error) return EIO;  // overrun: its completions are already lost
    // The work requests posted before the resize complete into the CQ first,
    // as a device has executed them by the time its command interface gets
    // to a resize: a size below what they leave to poll is then refused
    // however quickly the resize followed them, and however much of the
    // turn's budget is gone (rdma-core's test_resize_cq, which failed under
    // ASan until the budget was lifted here).
    // What is still in flight then (across the fabric a send completes
    // when its answer or its write to the socket comes back) counts as
    // completions to come: a CQ resized below them would overrun.
    const uint64_t t = eng.now();
    uint64_t in_flight = 0;
    eng.turns().outside_budget([&] {
        ctx.qps.for_each([&](uint32_t, Qp& qp) {
            if (qp.send_cq != r.cq_handle) return;
            requester_process(eng, ctx, qp, t);
            in_flight += ring_count(qp.req.sq_next, qp.sq.cons, qp.sq.entries);
        });
    });
    uint32_t cons = cq->ring->consumer.load(std::memory_order_acquire);
    if (!ring_valid_consumer(cons, cq->prod, cq->entries)) return EINVAL;
    uint32_t outstanding = ring_count(cq->prod, cons, cq->entries);
    // As rxe: never below what waits to be polled (or will be).
    if (outstanding + in_flight > r.cqe) return EINVAL;
    HostRange ring;
    if (int err = map_ring(ctx, r.ring_gva, abi::cq_ring_bytes(r.entries), ring)) return err;
    {
        // The new ring must not overlap the old one (the copy would read what it wrote).
        auto old_lo = reinterpret_cast<uintptr_t>(cq->ring);
        auto new_lo = reinterpret_cast<uintptr_t>(ring.host);
        if (new_lo < old_lo + abi::cq_ring_bytes(cq->entries) && old_lo < new_lo + abi::cq_ring_bytes(r.entries))
            return EINVAL;
    }
    auto* hdr = reinterpret_cast<abi::RingHeader*>(ring.host);
    auto* notify = reinterpret_cast<abi::CqNotify*>(ring.host + sizeof(abi::RingHeader));
    auto* slots = reinterpret_cast<abi::Cqe*>(ring.host + abi::cq_slots_offset());
    // Completions in flight keep their order; the new ring starts at index 0.
    for (uint32_t i = 0, idx = cons; i < outstanding; ++i, idx = ring_next(idx, cq->entries)) {
        std::memcpy(&slots[i], &cq->slots[ring_slot(idx, cq->entries)], sizeof(abi::Cqe));
        slots[i].flags = abi::cqe_flags_at(slots[i].flags, i, r.entries);
    }
    // Silent completions (cq_events.h) keep their distance from the consumer.
    auto move_silent = [&](bool& silent, uint32_t& end) {
        if (silent && cq_unpolled(*cq, end, cons))
            end = ring_count(end, cons, cq->entries);
        else
            silent = false;
    };
    move_silent(cq->silent, cq->silent_end);
    move_silent(cq->silent_solicited, cq->silent_solicited_end);
    notify->arm_solicited.store(cq->notify->arm_solicited.load(std::memory_order_relaxed), std::memory_order_relaxed);
    notify->arm_seq.store(cq->notify->arm_seq.load(std::memory_order_acquire), std::memory_order_release);
    hdr->consumer.store(0, std::memory_order_relaxed);
    hdr->produced.store(cq->produced, std::memory_order_relaxed);  // the count goes on
    hdr->producer.store(outstanding, std::memory_order_release);
    cq->ring = hdr;
    cq->notify = notify;
    cq->slots = slots;
    cq->entries = r.entries;
    cq->prod = outstanding;
    cq->cons_seen = 0;
    cq->keep = std::move(ring.keepalive);
    store_resp(resp, abi::CmdResizeCqResp{outstanding});
    return 0;
}

}  // namespace vrdma::shim
