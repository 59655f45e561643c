#include "cq_writer.h"

#include <infiniband/verbs.h>

#include <time.h>

#include <cstring>

#include "async_events.h"
#include "cq_events.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

uint64_t clock_ns(clockid_t clock) {
    timespec ts;
    clock_gettime(clock, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

void cq_fail(Context& ctx, Cq& cq, const char* why) {
    if (cq.error) return;
    cq.error = true;
    LOG_WARN("context %llu: CQ in error: %s", (unsigned long long)ctx.id(), why);
    post_cq_event(ctx, cq, IBV_EVENT_CQ_ERR);
}

}  // namespace

bool cq_push(Context& ctx, uint32_t cq_handle, const abi::Cqe& cqe, bool solicited) {
    Cq* cq = ctx.cqs.get(cq_handle);
    if (!cq || cq->error) return false;
    // Room by the consumer index last seen is room (the guest's index only
    // moves forward from it); only a ring that looks full is looked at
    // again. A guest that writes a bad index is caught then: until the
    // ring fills, its polls had nothing to lose.
    if (ring_full(cq->prod, cq->cons_seen, cq->entries)) {
        const uint32_t cons = cq->ring->consumer.load(std::memory_order_acquire);
        if (!ring_valid_consumer(cons, cq->prod, cq->entries)) {
            cq_fail(ctx, *cq, "invalid consumer index");
            return false;
        }
        if (ring_full(cq->prod, cons, cq->entries)) {
            cq_fail(ctx, *cq, "overrun");
            return false;
        }
        cq->cons_seen = cons;
    }
    abi::Cqe* slot = &cq->slots[ring_slot(cq->prod, cq->entries)];
    // The flags word, with the owner bit, goes last (abi.h kCqeOwner).
    constexpr size_t kFlagsAt = offsetof(abi::Cqe, flags), kAfterFlags = kFlagsAt + sizeof(uint16_t);
    std::memcpy(slot, &cqe, kFlagsAt);
    std::memcpy(reinterpret_cast<uint8_t*>(slot) + kAfterFlags, reinterpret_cast<const uint8_t*>(&cqe) + kAfterFlags,
                sizeof(cqe) - kAfterFlags);
    if (cq->timestamps) {
        // Two vDSO clock reads, only for CQs that asked (ibv_create_cq_ex
        // with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP or _WALLCLOCK).
        slot->completion_ns = clock_ns(CLOCK_MONOTONIC);
        slot->wallclock_ns = clock_ns(CLOCK_REALTIME);
    }
    // Before the guest can see the completion: its owner bit publishes it
    // to a poll, the producer index to the VM's event thread (cq_events.h).
    const uint32_t arm_before = cq_arm_before_push(*cq);
    const uint16_t flags = uint16_t((solicited ? abi::kCqeSolicited : 0) | abi::cqe_owner(cq->prod, cq->entries));
    __atomic_store_n(&slot->flags, flags, __ATOMIC_RELEASE);
    cq->prod = ring_next(cq->prod, cq->entries);
    cq->ring->produced.store(++cq->produced, std::memory_order_relaxed);  // the producer's store publishes it
    cq->ring->producer.store(cq->prod, std::memory_order_release);
    cq_after_push(ctx, cq_handle, *cq, solicited || cqe.status != IBV_WC_SUCCESS, arm_before);
    return true;
}

}  // namespace vrdma::shim
