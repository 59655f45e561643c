// The lkeys and rkeys of one context: memory regions and memory windows.
//
// A key is [index:24][tag:8], as on a real HCA. The index is drawn from the
// kernel's CSPRNG (secure_random.h), never 0, unique among the context's
// live keys, and not handed out again until kQuarantine other keys were
// released after it; the tag is random too, so an MR's key is 32 random
// bits: a key tells nothing about the next one, and a key that was revoked
// (deregistered) does not come back soon as another object's. A memory
// window keeps its index for life and changes its tag at each bind (the
// application picks the next one with ibv_inc_rkey): lookup goes by index,
// then all 32 bits must match.
#pragma once

#include <cstddef>
#include <cstdint>
#include "flat_map.h"
#include "recent_ids.h"

namespace vrdma::shim {

enum class KeyKind : uint8_t { Mr, Mw };

class KeyTable {
public:
    static constexpr size_t kQuarantine = 16384;

    // A new key naming `handle`, an object of `kind`.
    uint32_t alloc(uint32_t handle, KeyKind kind);
    // Takes `key` as it is (a device's key, hca_device.h: the device decides
    // its keys and when they come back, so the quarantine does not apply).
    // False if its index is live.
    bool insert(uint32_t key, uint32_t handle, KeyKind kind);
    // The handle of the `kind` object `key` names exactly, 0 if none (the
    // fast path: one hash lookup).
    uint32_t lookup(uint32_t key, KeyKind kind) const {
        const Entry* e = live_.find(key >> 8);
        if (!e || e->key != key || e->kind != kind) return 0;
        return e->handle;
    }
    // A window's new key: `key` with the tag of `new_key` (same index).
    // False if `key` is not live.
    bool retag(uint32_t key, uint32_t new_key);
    void release(uint32_t key);
    size_t size() const { return live_.size(); }

private:
    struct Entry {
        uint32_t handle = 0;
        uint32_t key = 0;
        KeyKind kind = KeyKind::Mr;
    };
    FlatU32Map<Entry> live_;  // by index
    RecentIds recent_{kQuarantine};             // released indices
};

}  // namespace vrdma::shim
