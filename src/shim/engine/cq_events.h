// Completion events (docs/protocol.md "Events"): the guest arms a CQ by
// advancing CqNotify::arm_seq in the CQ's memory (no command); the shim
// writes one record, the CQ's user_handle, into the CQ's completion channel
// for the first completion added after the arming that matches it (any
// completion; with arm_solicited only a solicited receive or an error
// completion). Completions already in the CQ when it is armed raise nothing,
// as ibv_req_notify_cq(3) says and as rxe and siw do: the consumer polls
// after arming (the pattern of ibv_get_cq_event(3)) to collect them. Raising
// for them instead would give a spurious event to every consumer that arms
// and then polls, which unmodified programs such as perftest's
// ib_send_lat -e do not survive.
#pragma once

#include "context.h"
#include "resources.h"

namespace vrdma::shim {

// After a CQE was written to `cq`. `wakes_solicited`: the CQE is a solicited
// receive or an error completion (it also wakes a solicited-only arming).
void cq_after_push(Context& ctx, Cq& cq, bool wakes_solicited);

}  // namespace vrdma::shim
