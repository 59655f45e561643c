// The engine's clock: CLOCK_MONOTONIC in nanoseconds, replaceable by a
// test's (set_clock) so that timers, dormancy and turn times can be driven
// without waiting.
#pragma once

#include <cstdint>

namespace vrdma::shim {

uint64_t monotonic_ns();

struct Clock {
    uint64_t (*read)() = monotonic_ns;
    uint64_t now() const { return read(); }
};

}  // namespace vrdma::shim
