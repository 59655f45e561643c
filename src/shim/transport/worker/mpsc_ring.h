// A bounded ring of T from any number of producer threads to one consumer
// thread, without locks (D. Vyukov's bounded queue, with one consumer):
// each slot carries a sequence number saying whose turn it is. A producer
// claims the slot at the tail (compare-exchange of the tail), fills it and
// publishes it (a release store of its sequence); the consumer reads the
// slot at its head once that sequence says it is filled, and gives it back
// (a release store of the sequence a lap ahead). Each producer's messages
// come out in the order it published them. Slots are objects that live as
// long as the ring and are reused, so a message that owns resources
// (shared_ptr pins) is moved in and out, never allocated per message.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace vrdma::shim {

template <typename T>
class MpscRing {
public:
    // `capacity`: a power of two.
    explicit MpscRing(uint32_t capacity) : slots_(new Slot[capacity]), mask_(capacity - 1) {
        for (uint32_t i = 0; i < capacity; ++i) slots_[i].seq.store(i, std::memory_order_relaxed);
    }
    MpscRing(const MpscRing&) = delete;
    MpscRing& operator=(const MpscRing&) = delete;

    // Producer: claims a free slot to fill (its position in `pos`), or
    // returns null when the ring is full. A claimed slot must be published.
    T* claim(uint64_t& pos) {
        uint64_t p = tail_.load(std::memory_order_relaxed);
        for (;;) {
            Slot& s = slots_[p & mask_];
            const int64_t dif = int64_t(s.seq.load(std::memory_order_acquire)) - int64_t(p);
            if (dif == 0) {
                if (tail_.compare_exchange_weak(p, p + 1, std::memory_order_relaxed)) {
                    pos = p;
                    return &s.value;
                }
            } else if (dif < 0) {
                return nullptr;  // a lap behind: full
            } else {
                p = tail_.load(std::memory_order_relaxed);  // another producer took it
            }
        }
    }
    // Producer: the slot claimed at `pos` is filled.
    void publish(uint64_t pos) { slots_[pos & mask_].seq.store(pos + 1, std::memory_order_release); }

    // Consumer: the oldest published slot, or null (empty, or the next slot
    // claimed and not yet filled).
    T* front() {
        Slot& s = slots_[head_ & mask_];
        return s.seq.load(std::memory_order_acquire) == head_ + 1 ? &s.value : nullptr;
    }
    // Consumer: the front slot is done with (producers may reuse it).
    void pop() {
        slots_[head_ & mask_].seq.store(head_ + mask_ + 1, std::memory_order_release);
        ++head_;
    }
    // Consumer: whether a producer has claimed a slot not yet consumed
    // (possibly still filling it).
    bool empty() const { return tail_.load(std::memory_order_seq_cst) == head_; }

private:
    struct Slot {
        std::atomic<uint64_t> seq;
        T value;
    };
    std::unique_ptr<Slot[]> slots_;
    const uint64_t mask_;
    alignas(64) std::atomic<uint64_t> tail_{0};
    alignas(64) uint64_t head_ = 0;  // the consumer's
};

}  // namespace vrdma::shim
