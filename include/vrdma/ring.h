// Ring index arithmetic shared by the provider and the shim.
//
// Every ring has a power-of-two number of slots `size`. Producer and consumer
// indices run over [0, 2*size): the low bits select the slot, the bit `size`
// is the wrap bit. Empty: indices equal. Full: they differ only in the wrap
// bit. An index read from the other side is untrusted until ring_valid_*
// accepted it.
#pragma once

#include <cstdint>

namespace vrdma {

constexpr bool is_pow2(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

constexpr uint32_t ring_mask(uint32_t size) { return 2 * size - 1; }
constexpr uint32_t ring_slot(uint32_t idx, uint32_t size) { return idx & (size - 1); }
constexpr uint32_t ring_next(uint32_t idx, uint32_t size) { return (idx + 1) & ring_mask(size); }
constexpr uint32_t ring_advance(uint32_t idx, uint32_t n, uint32_t size) { return (idx + n) & ring_mask(size); }

// Entries between consumer and producer (0..size when both are valid).
constexpr uint32_t ring_count(uint32_t prod, uint32_t cons, uint32_t size) {
    return (prod - cons) & ring_mask(size);
}
constexpr bool ring_empty(uint32_t prod, uint32_t cons) { return prod == cons; }
constexpr bool ring_full(uint32_t prod, uint32_t cons, uint32_t size) { return (prod ^ cons) == size; }

// An index is well-formed if it lies in [0, 2*size).
constexpr bool ring_index_ok(uint32_t idx, uint32_t size) { return idx <= ring_mask(size); }

// A producer index written by the other side, checked against the consumer
// index we own: well-formed and no more than `size` entries ahead.
constexpr bool ring_valid_producer(uint32_t prod, uint32_t our_cons, uint32_t size) {
    return ring_index_ok(prod, size) && ring_count(prod, our_cons, size) <= size;
}
// A consumer index written by the other side, checked against the producer
// index we own: well-formed and not ahead of us.
constexpr bool ring_valid_consumer(uint32_t cons, uint32_t our_prod, uint32_t size) {
    return ring_index_ok(cons, size) && ring_count(our_prod, cons, size) <= size;
}

}  // namespace vrdma
