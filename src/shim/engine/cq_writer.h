// Writing completions into a guest CQ ring (the shim is the producer).
#pragma once

#include <cstdint>

#include "context.h"
#include "vrdma/abi.h"

namespace vrdma::shim {

// Appends `cqe` to the CQ `cq_handle` of `ctx`. A CQ that is full (per the
// consumer index the guest wrote, validated) is overrun: it goes to error,
// IBV_EVENT_CQ_ERR is posted and this and later completions are dropped.
// Returns false when the completion was dropped. `solicited`: a receive
// completion of a message sent with IBV_SEND_SOLICITED (an error completion
// counts as solicited by itself); it matters to a solicited-only arming of
// the CQ's completion channel (cq_events.h).
bool cq_push(Context& ctx, uint32_t cq_handle, const abi::Cqe& cqe, bool solicited = false);

}  // namespace vrdma::shim
