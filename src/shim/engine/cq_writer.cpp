#include "cq_writer.h"

#include <infiniband/verbs.h>

#include <cstring>

#include "async_events.h"
#include "cq_events.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

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
    uint32_t cons = cq->ring->consumer.load(std::memory_order_acquire);
    if (!ring_valid_consumer(cons, cq->prod, cq->entries)) {
        cq_fail(ctx, *cq, "invalid consumer index");
        return false;
    }
    if (ring_full(cq->prod, cons, cq->entries)) {
        cq_fail(ctx, *cq, "overrun");
        return false;
    }
    std::memcpy(&cq->slots[ring_slot(cq->prod, cq->entries)], &cqe, sizeof(cqe));
    cq->prod = ring_next(cq->prod, cq->entries);
    cq->ring->producer.store(cq->prod, std::memory_order_release);
    cq_after_push(ctx, *cq, solicited || cqe.status != IBV_WC_SUCCESS);
    return true;
}

}  // namespace vrdma::shim
