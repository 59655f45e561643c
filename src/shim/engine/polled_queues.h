// Polled queues (protocol.md "Polled queues"): a QP whose work bit the shim
// just found is, for a while, looked at by its producer indices at every
// pass, and its rings' headers say so (abi::RingHeader::polled). While they
// do, its guest posts without setting the work bit: one store and one load
// on the producer's line instead of two locked read-modify-writes on lines
// the shim writes back, and the shim reads the producer it had to read
// anyway instead of the summary and the work word first. This is virtio's
// notification suppression (VRING_USED_F_NO_NOTIFY) for a QP.
//
// The shim keeps its own record of which QPs it polls and never reads the
// flag back: a guest that sets it where the shim does not poll only hides
// its own posts, and one that clears it only sets bits it need not.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "resources.h"

namespace vrdma::shim {

class Context;

class PolledQueues {
public:
    // At most this many QPs of a context are polled at once: a pass costs
    // two loads for each, busy or not.
    static constexpr size_t kMaxPerContext = 4;
    // A polled QP whose producers did not move for this long goes back to
    // its work bit (below the worker's idle spin, kIdleSpinNs, so that a
    // worker about to sleep polls none).
    static constexpr uint64_t kCoolAfterNs = 50'000;

    // A QP whose work bit was found at `t`: polled from now on, if there is room.
    void adopt(Qp& qp, uint64_t t);
    // A QP about to be destroyed leaves the list.
    void forget(Qp& qp);
    // Marks the polled QPs whose producers moved since the last look (as
    // their work bits would have), and lets those idle for kCoolAfterNs go.
    void check(Context& ctx, uint64_t t) {
        for (size_t i = 0; i < qps_.size();) {
            Qp& qp = *qps_[i];
            if (take_moved(qp)) {
                qp.polled_moved_ns = t;
                mark(ctx, qp);
            } else if (t - qp.polled_moved_ns >= kCoolAfterNs) {
                cool(ctx, qp);
                qps_[i] = qps_.back();  // order does not matter
                qps_.pop_back();
                continue;
            }
            ++i;
        }
    }
    // Whether a producer moved since the last look (the turn scheduler's
    // view of another guest's work; nothing changes).
    bool moved() const {
        for (const Qp* qp : qps_)
            if (producer(qp->sq, qp->polled_sq_prod) != qp->polled_sq_prod ||
                producer(qp->rq, qp->polled_rq_prod) != qp->polled_rq_prod)
                return true;
        return false;
    }
    bool empty() const { return qps_.empty(); }
    size_t size() const { return qps_.size(); }

private:
    // The ring's producer index, or `seen` where there is no ring (an XRC
    // receive QP has no send queue, a QP on an SRQ no receive queue of its
    // own: the shim gives it none).
    static uint32_t producer(const WorkQueue& wq, uint32_t seen) {
        return wq.ring ? wq.ring->producer.load(std::memory_order_seq_cst) : seen;
    }
    // Whether a producer of `qp` moved since the last look; the look is kept.
    static bool take_moved(Qp& qp) {
        const uint32_t sq = producer(qp.sq, qp.polled_sq_prod);
        const uint32_t rq = producer(qp.rq, qp.polled_rq_prod);
        const bool moved = sq != qp.polled_sq_prod || rq != qp.polled_rq_prod;
        qp.polled_sq_prod = sq;
        qp.polled_rq_prod = rq;
        return moved;
    }
    static void mark(Context& ctx, Qp& qp);
    // Stops polling `qp`: the flag goes, then the producers are looked at
    // once more (a post that read the flag before it went set no bit).
    static void cool(Context& ctx, Qp& qp);

    // Live QPs only: a QP leaves (forget) before it is destroyed.
    std::vector<Qp*> qps_;
};

}  // namespace vrdma::shim
