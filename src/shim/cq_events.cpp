#include "cq_events.h"

#include "vrdma/ring.h"

namespace vrdma::shim {
namespace {

// Consumes every arming made so far and writes the event record.
void raise(Context& ctx, Cq& cq, uint32_t arm_seq) {
    cq.last_arm_seq = arm_seq;
    cq.seen_arm_seq = arm_seq;
    if (ctx.post_comp_event(cq.channel_id, cq.user_handle)) ++cq.comp_events;
}

// A new arming (arm_seq moved since the last look) while completions are in
// the CQ: raise now, or the guest, which may sleep right after arming,
// would wait for a completion that already came.
bool check_arm(Context& ctx, Cq& cq) {
    if (cq.error) return false;
    const uint32_t arm = cq.notify->arm_seq.load(std::memory_order_acquire);
    if (arm == cq.seen_arm_seq) return false;
    cq.seen_arm_seq = arm;
    if (arm == cq.last_arm_seq) return false;
    const uint32_t cons = cq.ring->consumer.load(std::memory_order_acquire);
    if (!ring_valid_consumer(cons, cq.prod, cq.entries)) return false;  // cq_push puts it in error
    const uint32_t unconsumed = ring_count(cq.prod, cons, cq.entries);
    if (unconsumed == 0) return false;
    const bool solicited_only = cq.notify->arm_solicited.load(std::memory_order_relaxed) != 0;
    // The unconsumed CQEs are the newest `unconsumed` pushes.
    if (solicited_only && !(cq.last_wake_push && cq.pushes - cq.last_wake_push < unconsumed)) return false;
    raise(ctx, cq, arm);
    return true;
}

}  // namespace

void cq_after_push(Context& ctx, Cq& cq, bool wakes_solicited) {
    ++cq.pushes;
    if (wakes_solicited) cq.last_wake_push = cq.pushes;
    if (!cq.channel_id) return;
    const uint32_t arm = cq.notify->arm_seq.load(std::memory_order_acquire);
    if (arm == cq.last_arm_seq) return;  // not armed
    if (!wakes_solicited && cq.notify->arm_solicited.load(std::memory_order_relaxed)) return;
    raise(ctx, cq, arm);
}

bool check_armed_cqs(Context& ctx) {
    bool raised = false;
    for (uint32_t h : ctx.channel_cqs)
        if (Cq* cq = ctx.cqs.get(h)) raised |= check_arm(ctx, *cq);
    return raised;
}

}  // namespace vrdma::shim
