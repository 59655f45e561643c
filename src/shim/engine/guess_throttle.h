// Throttling of key guessing (docs/reliability.md "What a tenant can do to
// another"). Every error a guess causes is charged to its source in a
// token bucket: `limit` errors at once, then `limit` a second. A source
// whose bucket is empty is throttled until a token is back. The shim has
// two (shared_tables.h):
//   rkeys: the source is the requester's LID, the guest it speaks for,
//     here or on another shim; its errors are remote access errors (a
//     wrong rkey, range or access). Throttled, its RDMA and atomic
//     requests to this shim's guests are dropped unexamined (its requester
//     sees lost packets: the QP's timeout, then RETRY_EXC_ERR). SENDs are
//     not throttled: they carry no key.
//   qkeys: the source is the pair (sender's LID, target guest's LID),
//     pair(); its errors are UD datagrams with a wrong qkey. Throttled, its
//     datagrams to that guest are dropped unexamined (qkey_guard.h). By
//     pair, because a guest can make an honest sender's datagrams wrong by
//     changing its own QP's qkey: that may cost the sender its datagrams
//     to that guest, never those to the others.
//
// An honest program makes neither error often (a remote access error puts
// its QP and the target QP in error; a datagram with a wrong qkey is a
// misconfiguration), so a bucket only ever empties for a guesser. Its
// guesses then cost a transport timeout (rkeys) or are lost unexamined
// (qkeys) instead of a round trip.
//
// One throttle serves all workers of a shim: a source's errors count
// whichever worker serves its targets. The fast path is one relaxed atomic
// load (anyone_throttled); charging and the throttled path lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace vrdma::shim {

class GuessThrottle {
public:
    static constexpr uint32_t kDefaultLimit = 32;

    // The source of a qkey guess: a sender's LID and its target's.
    static constexpr uint32_t pair(uint16_t source_lid, uint16_t target_lid) {
        return uint32_t(source_lid) << 16 | target_lid;
    }

    // 0: never throttle. Set before the workers run.
    void set_limit(uint32_t errors_per_second) { limit_ = errors_per_second; }
    uint32_t limit() const { return limit_; }

    // One error caused by `source`. True when this one emptied its bucket
    // (the source is throttled from now on).
    bool charge(uint32_t source, uint64_t now_ns);

    // Whether some source is throttled now: the check of every request,
    // before it needs the time.
    bool anyone_throttled() const { return throttled_sources_.load(std::memory_order_relaxed) != 0; }
    // Whether what `source` sends is dropped now.
    bool throttled(uint32_t source, uint64_t now_ns) { return anyone_throttled() && throttled_slow(source, now_ns); }

private:
    struct Bucket {
        double tokens = 0;
        uint64_t at_ns = 0;  // when `tokens` was last brought up to date
        bool empty = false;  // counted in throttled_sources_
    };
    void refill(Bucket& b, uint64_t now_ns) const;
    bool throttled_slow(uint32_t source, uint64_t now_ns);
    void drop_full_buckets(uint64_t now_ns);

    // Buckets are kept for sources that made an error. Past this many, those
    // refilled to the limit (as good as none) go, so that many sources with
    // one error each (qkey pairs) cannot grow the table for ever.
    static constexpr size_t kPruneAt = 1 << 16;

    uint32_t limit_ = kDefaultLimit;
    std::atomic<uint32_t> throttled_sources_{0};
    std::mutex mutex_;  // buckets_, prune_at_
    std::unordered_map<uint32_t, Bucket> buckets_;
    size_t prune_at_ = kPruneAt;
};

}  // namespace vrdma::shim
