// Packet sequence numbers: 24 bits, compared in a window of half the space.
#pragma once

#include <cstdint>

namespace vrdma::shim {

constexpr uint32_t kPsnMask = 0xffffff;
constexpr uint32_t psn_next(uint32_t psn) { return (psn + 1) & kPsnMask; }
constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }
// Distance from `from` forward to `to`.
constexpr uint32_t psn_diff(uint32_t to, uint32_t from) { return (to - from) & kPsnMask; }
// True if `a` comes before `b` (within half the PSN space).
constexpr bool psn_before(uint32_t a, uint32_t b) { return a != b && psn_diff(b, a) < (1u << 23); }

}  // namespace vrdma::shim
