#include "polled_queues.h"

#include <algorithm>

#include "context.h"

namespace vrdma::shim {

namespace {

void set_flag(WorkQueue& wq, uint32_t on) {
    if (wq.ring) wq.ring->polled.store(on, std::memory_order_seq_cst);
}

}  // namespace

void PolledQueues::adopt(Qp& qp, uint64_t t) {
    qp.polled_moved_ns = t;
    if (qp.polled || qps_.size() >= kMaxPerContext) return;
    qp.polled = true;
    // The producers as they are now: the bit that was found covers them.
    (void)take_moved(qp);
    set_flag(qp.sq, 1);
    set_flag(qp.rq, 1);
    qps_.push_back(&qp);
}

void PolledQueues::forget(Qp& qp) {
    if (!qp.polled) return;
    qp.polled = false;
    std::erase(qps_, &qp);
}

void PolledQueues::mark(Context& ctx, Qp& qp) { ctx.mark_work(qp); }

void PolledQueues::cool(Context& ctx, Qp& qp) {
    qp.polled = false;
    set_flag(qp.sq, 0);
    set_flag(qp.rq, 0);
    // Both sides store, then load (seq_cst): a guest that still read the
    // flag set has its producer seen here.
    if (take_moved(qp)) ctx.mark_work(qp);
}

}  // namespace vrdma::shim
