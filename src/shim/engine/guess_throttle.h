// Throttling of rkey guessing (docs/reliability.md "What a tenant can do to
// another"). Every remote access error a requester causes (a wrong rkey,
// range or access) is charged to its source LID, the guest it speaks for,
// here or on another shim, in a token bucket: `limit` errors at once, then
// `limit` a second. A source whose bucket is empty is throttled: its RDMA
// and atomic requests to this shim's guests are dropped unexamined (its
// requester sees lost packets: the QP's timeout, then RETRY_EXC_ERR) until
// a token is back. SENDs are not throttled: they carry no key.
//
// An honest program does not make remote access errors (each one puts its
// QP and the target QP in error), so the bucket only ever empties for a
// guesser. Its guesses then cost a transport timeout each, not a round
// trip. The fast path pays one branch while nobody is throttled.
//
// One throttle serves all workers of a shim (shared_tables.h): a source's
// errors count whichever worker serves its targets. The fast path is one
// relaxed atomic load; charging and the throttled path lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace vrdma::shim {

class GuessThrottle {
public:
    static constexpr uint32_t kDefaultLimit = 32;

    // 0: never throttle. Set before the workers run.
    void set_limit(uint32_t errors_per_second) { limit_ = errors_per_second; }
    uint32_t limit() const { return limit_; }

    // One remote access error caused by `lid`. True when this one emptied
    // its bucket (the source is throttled from now on: log it).
    bool charge(uint16_t lid, uint64_t now_ns);

    // Whether requests with an rkey from `lid` are dropped now.
    bool throttled(uint16_t lid, uint64_t now_ns) {
        return throttled_sources_.load(std::memory_order_relaxed) != 0 && throttled_slow(lid, now_ns);
    }

private:
    struct Bucket {
        double tokens = 0;
        uint64_t at_ns = 0;  // when `tokens` was last brought up to date
        bool empty = false;  // counted in throttled_sources_
    };
    void refill(Bucket& b, uint64_t now_ns) const;
    bool throttled_slow(uint16_t lid, uint64_t now_ns);

    uint32_t limit_ = kDefaultLimit;
    std::atomic<uint32_t> throttled_sources_{0};
    std::mutex mutex_;  // buckets_
    // Only sources that made an error have a bucket: at most one per LID.
    std::unordered_map<uint16_t, Bucket> buckets_;
};

}  // namespace vrdma::shim
