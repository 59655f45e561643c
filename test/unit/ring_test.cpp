#include <catch2/catch.hpp>

#include "vrdma/ring.h"

using namespace vrdma;

TEST_CASE("ring indices carry a wrap bit", "[ring]") {
    constexpr uint32_t size = 4;
    uint32_t prod = 0, cons = 0;
    CHECK(ring_empty(prod, cons));
    for (int i = 0; i < 4; ++i) prod = ring_next(prod, size);
    CHECK(prod == 4);
    CHECK(ring_full(prod, cons, size));
    CHECK(ring_count(prod, cons, size) == 4);
    for (int i = 0; i < 4; ++i) cons = ring_next(cons, size);
    CHECK(ring_empty(prod, cons));
    // Wraps back to 0 after 2*size increments.
    for (int i = 0; i < 4; ++i) prod = ring_next(prod, size);
    CHECK(prod == 0);
    CHECK(ring_count(prod, cons, size) == 4);
    CHECK(ring_slot(7, size) == 3);
}

TEST_CASE("untrusted ring indices are rejected", "[ring][validation]") {
    constexpr uint32_t size = 8;
    CHECK(ring_valid_producer(3, 0, size));
    CHECK(ring_valid_producer(8, 0, size));       // exactly full
    CHECK_FALSE(ring_valid_producer(9, 0, size));  // more than size ahead
    CHECK_FALSE(ring_valid_producer(16, 0, size)); // outside [0, 2*size)
    CHECK_FALSE(ring_valid_producer(0xffffffff, 0, size));
    CHECK(ring_valid_producer(1, 12, size));       // wrapped: 5 entries
    CHECK_FALSE(ring_valid_producer(11, 12, size)); // behind the consumer = 15 ahead
    CHECK(ring_valid_consumer(0, 8, size));
    CHECK(ring_valid_consumer(8, 8, size));
    CHECK_FALSE(ring_valid_consumer(9, 8, size));  // ahead of the producer
    CHECK_FALSE(ring_valid_consumer(100, 8, size));
    CHECK_FALSE(is_pow2(0));
    CHECK(is_pow2(1));
    CHECK_FALSE(is_pow2(12));
}
