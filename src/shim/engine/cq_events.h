// Completion events (docs/protocol.md "Events"): the guest arms a CQ by
// advancing CqNotify::arm_seq in the CQ's memory (no command) and ringing
// the doorbell; the shim writes one record, the CQ's user_handle, into the
// CQ's completion channel per arming, when either
//  - a completion matching the arming (any completion; with arm_solicited
//    only a solicited receive or an error completion) is added after the
//    arming (cq_after_push), or
//  - the arming finds a matching completion that was added while the CQ was
//    not armed for it (a "silent" one) and is still unpolled
//    (cq_check_armings, when the doorbell rings).
// The second rule is how an HCA behaves (mlx5 arms relative to the
// consumer index, so unpolled completions raise the event at once), and
// programs rely on it without knowing: Open MPI's openib connection manager
// polls its CQ until empty and then arms it without polling again, so a
// datagram completing in between would otherwise never wake it (the rare
// hang of the 4-rank MPI test). A completion that already raised its event
// raises no second one, so the usual loop (get event, ack, arm, poll) sees
// no spurious event for the completion it is about to poll, which perftest's
// ib_send_lat -e, polling once per event, would not survive.
#pragma once

#include <cstdint>

#include "context.h"
#include "resources.h"

namespace vrdma::shim {

// arm_seq as read before a CQE is published (its owner bit, then the
// producer index; any value when the CQ has no channel).
inline uint32_t cq_arm_before_push(const Cq& cq) {
    return cq.channel_id ? cq.notify->arm_seq.load(std::memory_order_acquire) : 0;
}

// After a CQE was written to `cq` (handle `cq_handle`) and published.
// `wakes_solicited`: the CQE is a solicited receive or an error completion
// (it also wakes a solicited-only arming). `arm_before`: cq_arm_before_push
// of that CQE.
void cq_after_push(Context& ctx, uint32_t cq_handle, Cq& cq, bool wakes_solicited, uint32_t arm_before);

// Whether the completion just before index `end` is still unpolled, given
// the guest's consumer index `cons` (checked) and the shim's producer.
bool cq_unpolled(const Cq& cq, uint32_t end, uint32_t cons);

// After the guest rang the doorbell: each CQ armed since its last event
// that holds an unpolled silent completion matching the arming gets its
// event. O(CQs holding silent completions).
void cq_check_armings(Context& ctx);

}  // namespace vrdma::shim
