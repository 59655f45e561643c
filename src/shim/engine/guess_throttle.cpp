#include "guess_throttle.h"

#include <algorithm>

namespace vrdma::shim {

void GuessThrottle::refill(Bucket& b, uint64_t now_ns) const {
    if (now_ns > b.at_ns) b.tokens = std::min<double>(limit_, b.tokens + double(now_ns - b.at_ns) * limit_ / 1e9);
    b.at_ns = now_ns;
}

bool GuessThrottle::charge(uint16_t lid, uint64_t now_ns) {
    if (!limit_) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, fresh] = buckets_.try_emplace(lid);
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

bool GuessThrottle::throttled_slow(uint16_t lid, uint64_t now_ns) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = buckets_.find(lid);
    if (it == buckets_.end() || !it->second.empty) return false;
    Bucket& b = it->second;
    refill(b, now_ns);
    if (b.tokens < 1) return true;
    b.empty = false;  // a token is back: one more try
    --throttled_sources_;
    return false;
}

}  // namespace vrdma::shim
