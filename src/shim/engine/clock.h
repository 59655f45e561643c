// The engine's clock: CLOCK_MONOTONIC in nanoseconds, replaceable by a
// test's (set_clock) so that timers, dormancy and turn times can be driven
// without waiting.
#pragma once

#include <cstdint>

namespace vrdma::shim {

uint64_t monotonic_ns();

struct Clock {
    uint64_t (*read)() = monotonic_ns;
    mutable uint64_t latest = 0;  // the last reading, for what may start from it
    uint64_t now() const { return latest = read(); }
};

}  // namespace vrdma::shim
