// What a guest asks of the shim, for the operator (vrdmactl load): the
// turns its contexts got (passes that found work), the messages its
// requesters issued and their payload bytes (resends not counted again,
// whatever transport carried them), and the shim time its contexts' turns
// took (commands included). Written by the worker that serves the guest.
#pragma once

#include <cstdint>

namespace vrdma::shim {

struct GuestLoad {
    uint64_t turns = 0;
    uint64_t messages = 0;
    uint64_t bytes = 0;
    uint64_t busy_ns = 0;
    uint64_t qp_visits = 0;  // QPs its turns looked at (finding work: engine.cpp)
    // Work per turn is the guest's, not each context's (engine.h): what its
    // contexts used of the budget in pass `pass`.
    uint64_t pass = 0;
    uint64_t pass_used = 0;
    uint64_t pass_budget = 0;  // the budget pass_used counts against (0: the full one)
    uint64_t yields = 0;       // turns that gave way to another guest's work
};

// The worker's side: passes over all its contexts, and the time spent in
// turns that found work (the rest is spinning, the fabric and sleep).
struct WorkerLoad {
    uint64_t passes = 0;
    uint64_t busy_ns = 0;
};

}  // namespace vrdma::shim
