#include "guess_throttle.h"

#include <algorithm>
#include <iterator>

namespace vrdma::shim {

void GuessThrottle::refill(Bucket& b, uint64_t now_ns) const {
    if (now_ns > b.at_ns) b.tokens = std::min<double>(limit_, b.tokens + double(now_ns - b.at_ns) * limit_ / 1e9);
    b.at_ns = now_ns;
}

void GuessThrottle::drop_full_buckets(uint64_t now_ns) {
    for (auto it = buckets_.begin(); it != buckets_.end();) {
        Bucket& b = it->second;
        if (!b.empty) refill(b, now_ns);
        it = !b.empty && b.tokens >= limit_ ? buckets_.erase(it) : std::next(it);
    }
    // Sweep again only when the table doubled: each sweep is paid for by as
    // many new sources as it kept.
    prune_at_ = std::max(kPruneAt, 2 * buckets_.size());
}

bool GuessThrottle::charge(uint32_t source, uint64_t now_ns) {
    if (!limit_) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (buckets_.size() >= prune_at_ && !buckets_.count(source)) drop_full_buckets(now_ns);
    auto [it, fresh] = buckets_.try_emplace(source);
    Bucket& b = it->second;
    if (fresh) {
        b.tokens = limit_;
        b.at_ns = now_ns;
    }
    refill(b, now_ns);
    if (b.tokens >= 1) b.tokens -= 1;
    if (b.tokens >= 1 || b.empty) return false;
    b.empty = true;
    ++throttled_sources_;
    return true;
}

bool GuessThrottle::throttled_slow(uint32_t source, uint64_t now_ns) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = buckets_.find(source);
    if (it == buckets_.end() || !it->second.empty) return false;
    Bucket& b = it->second;
    refill(b, now_ns);
    if (b.tokens < 1) return true;
    b.empty = false;  // a token is back: one more try
    --throttled_sources_;
    return false;
}

}  // namespace vrdma::shim
