// The lkeys and rkeys of one context. A key is 32 bits from the kernel's
// CSPRNG (secure_random.h), never 0, unique among the context's live keys,
// and not handed out again until kQuarantine other keys were released after
// it: a key tells nothing about the next one, and a key that was revoked
// (deregistered) does not come back soon as another object's. A key names
// the handle of the object it was allocated for (an MR today; memory
// windows take theirs from the same table).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "recent_ids.h"

namespace vrdma::shim {

class KeyTable {
public:
    static constexpr size_t kQuarantine = 16384;

    // A new key naming `handle`.
    uint32_t alloc(uint32_t handle);
    // The handle a key names, 0 if none (the fast path: one hash lookup).
    uint32_t lookup(uint32_t key) const {
        auto it = live_.find(key);
        return it == live_.end() ? 0 : it->second;
    }
    void release(uint32_t key);
    size_t size() const { return live_.size(); }

private:
    std::unordered_map<uint32_t, uint32_t> live_;
    RecentIds recent_{kQuarantine};
};

}  // namespace vrdma::shim
