#include "cq_events.h"

#include <atomic>

#include "vrdma/ring.h"

namespace vrdma::shim {
namespace {

// Consumes the arming `arm` with one event record.
void raise_event(Context& ctx, Cq& cq, uint32_t arm) {
    cq.last_arm_seq = arm;
    // The guest will poll: the silent completions need no event of their own.
    cq.silent = cq.silent_solicited = false;
    if (ctx.post_comp_event(cq.channel_id, cq.user_handle)) ++cq.comp_events;
}

// The guest's consumer index, read now. False: it is no index of this
// ring (a bad one is reported by the push that finds the ring full by the
// index it last read: cq_writer.cpp).
bool consumer_now(const Cq& cq, uint32_t& cons) {
    cons = cq.ring->consumer.load(std::memory_order_acquire);
    return ring_valid_consumer(cons, cq.prod, cq.entries);
}

}  // namespace

bool cq_unpolled(const Cq& cq, uint32_t end, uint32_t cons) {
    const uint32_t waiting = ring_count(cq.prod, cons, cq.entries);
    const uint32_t upto_end = ring_count(end, cons, cq.entries);
    return upto_end >= 1 && upto_end <= waiting;
}

void cq_after_push(Context& ctx, uint32_t cq_handle, Cq& cq, bool wakes_solicited, uint32_t arm_before) {
    if (!cq.channel_id) return;
    // Pairs with the guest's arming (a locked read-modify-write of arm_seq
    // and of the doorbell) followed by its poll: either the guest's poll
    // sees the CQE just published, or this load sees the new arm_seq.
    // Without the fence the CQE's publication (its owner bit, which the
    // guest's poll reads) could still sit in this CPU's store buffer while
    // arm_seq is read, and both sides would miss.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t arm = cq.notify->arm_seq.load(std::memory_order_acquire);
    const bool armed = arm != cq.last_arm_seq;
    if (armed && (wakes_solicited || !cq.notify->arm_solicited.load(std::memory_order_relaxed))) {
        // Armed before the completion was published: it raises the event
        // even if the guest polled it already, as on an HCA (perftest -e,
        // one channel for its send and receive CQs, waits for one event per
        // completion). Armed since: a completion the guest polled before it
        // armed (read after arm_seq: its poll came first) wakes nobody, as
        // on an HCA, which arms relative to the consumer index; the arming
        // waits for the next one. The guest's poll and arming can both fall
        // between this completion's publication and the load of arm_seq above.
        uint32_t cons;
        if (arm_before == cq.last_arm_seq && consumer_now(cq, cons) && !cq_unpolled(cq, cq.prod, cons)) return;
        // One record per arming, however many ibv_req_notify_cq calls it took.
        raise_event(ctx, cq, arm);
        return;
    }
    // Silent. If the guest arms after this load, its doorbell comes after
    // too, and cq_check_armings finds this completion if it is still there.
    cq.silent = true;
    cq.silent_end = cq.prod;
    if (wakes_solicited) {
        cq.silent_solicited = true;
        cq.silent_solicited_end = cq.prod;
    }
    if (!cq.silent_listed) {
        cq.silent_listed = true;
        ctx.silent_cqs.push_back(cq_handle);  // no allocation once grown to the CQs
    }
}

void cq_check_armings(Context& ctx) {
    std::vector<uint32_t>& list = ctx.silent_cqs;
    size_t kept = 0;
    for (uint32_t h : list) {
        Cq* cq = ctx.cqs.get(h);
        if (!cq || !cq->silent_listed) continue;  // destroyed (the handle may be reused)
        uint32_t cons;
        const bool cons_ok = consumer_now(*cq, cons);
        if (cq->silent && (!cons_ok || !cq_unpolled(*cq, cq->silent_end, cons))) cq->silent = false;
        if (cq->silent_solicited && (!cons_ok || !cq_unpolled(*cq, cq->silent_solicited_end, cons)))
            cq->silent_solicited = false;
        if (!cq->silent && !cq->silent_solicited) {
            cq->silent_listed = false;
            continue;
        }
        const uint32_t arm = cq->notify->arm_seq.load(std::memory_order_acquire);
        const bool solicited_only = cq->notify->arm_solicited.load(std::memory_order_relaxed) != 0;
        if (arm != cq->last_arm_seq && (solicited_only ? cq->silent_solicited : cq->silent)) {
            raise_event(ctx, *cq, arm);
            cq->silent_listed = false;
            continue;
        }
        list[kept++] = h;
    }
    list.resize(kept);
}

}  // namespace vrdma::shim
