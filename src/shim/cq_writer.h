// Writing completions into a guest CQ ring (the shim is the producer).
#pragma once

#include <cstdint>

#include "context.h"
#include "vrdma/abi.h"

namespace vrdma::shim {

// Appends `cqe` to the CQ `cq_handle` of `ctx`. A CQ that is full (per the
// consumer index the guest wrote, validated) is overrun: it goes to error,
// IBV_EVENT_CQ_ERR is posted and this and later completions are dropped.
// Returns false when the completion was dropped.
bool cq_push(Context& ctx, uint32_t cq_handle, const abi::Cqe& cqe);

}  // namespace vrdma::shim
