// Completion events (docs/protocol.md "Events"): the guest arms a CQ by
// advancing CqNotify::arm_seq in the CQ's memory (no command); the shim
// writes one record, the CQ's user_handle, into the CQ's completion channel
// per arming, once a completion that matches the arming is in the CQ.
#pragma once

#include "context.h"
#include "resources.h"

namespace vrdma::shim {

// After a CQE was written to `cq`. `wakes_solicited`: the CQE is a solicited
// receive or an error completion (it also wakes a solicited-only arming).
void cq_after_push(Context& ctx, Cq& cq, bool wakes_solicited);

// A doorbell pass: for every CQ of the context that has a channel, a new
// arming that finds matching completions already in the CQ (not yet
// consumed by the guest) raises the event at once. True if one was raised.
bool check_armed_cqs(Context& ctx);

}  // namespace vrdma::shim
