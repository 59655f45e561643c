#include "cq_events.h"

#include <atomic>

namespace vrdma::shim {

void cq_after_push(Context& ctx, Cq& cq, bool wakes_solicited) {
    if (!cq.channel_id) return;
    // Pairs with the guest's arming (a locked read-modify-write of arm_seq
    // and of the doorbell) followed by its poll: either the guest's poll
    // sees the CQE just published, or this load sees the new arm_seq.
    // Without the fence the producer store could still sit in this CPU's
    // store buffer while arm_seq is read, and both sides would miss.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t arm = cq.notify->arm_seq.load(std::memory_order_acquire);
    if (arm == cq.last_arm_seq) return;  // not armed
    if (!wakes_solicited && cq.notify->arm_solicited.load(std::memory_order_relaxed)) return;
    // One record per arming, however many ibv_req_notify_cq calls it took.
    cq.last_arm_seq = arm;
    if (ctx.post_comp_event(cq.channel_id, cq.user_handle)) ++cq.comp_events;
}

}  // namespace vrdma::shim
