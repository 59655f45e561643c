// A map from integer keys (32 or 64 bits) to small values, for the
// lookups every message makes (an SGE's key, a request's destination QPN,
// the fabric's queue of a QP's output). std::unordered_map costs a
// division by its prime bucket count and a node to chase per lookup, and
// allocates a node per insertion; this is one array, open addressing with
// linear probing, indexed by a multiplicative hash (the top bits of
// key * 2^w/phi) of a power of two, at most half full. Erase shifts the
// entries behind the hole back instead of leaving tombstones, so that
// probes stay short however many keys come and go (keys, QPNs and the
// fabric's per-QP queues churn for the life of a shim).
//
// kEmpty (all ones) is never a key: set() ignores it, find() finds
// nothing. Pointers returned by find() are valid until the next set(),
// erase() or clear().
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace vrdma::shim {

template <class K, class V>
class FlatMap {
    static_assert(std::is_same_v<K, uint32_t> || std::is_same_v<K, uint64_t>, "32- or 64-bit unsigned keys");

public:
    static constexpr K kEmpty = std::numeric_limits<K>::max();

    FlatMap() { rehash(kMinBits); }

    V* find(K key) {
        if (key == kEmpty) return nullptr;  // a guest may name any number
        for (uint32_t i = home(key);; i = (i + 1) & mask_) {
            Slot& s = slots_[i];
            if (s.key == key) return &s.value;
            if (s.key == kEmpty) return nullptr;
        }
    }
    const V* find(K key) const { return const_cast<FlatMap*>(this)->find(key); }
    bool contains(K key) const { return find(key) != nullptr; }

    // Inserts `key` or replaces its value.
    void set(K key, V value) {
        if (key == kEmpty) return;
        if (V* v = find(key)) {
            *v = std::move(value);
            return;
        }
        if ((size_ + 1) * 2 > slots_.size()) rehash(bits_ + 1);
        place(key, std::move(value));
        ++size_;
    }

    // False if `key` was not there.
    bool erase(K key) {
        if (key == kEmpty) return false;
        uint32_t hole = home(key);
        while (slots_[hole].key != key) {
            if (slots_[hole].key == kEmpty) return false;
            hole = (hole + 1) & mask_;
        }
        // Every entry after the hole up to the next empty slot moves into it
        // unless its home lies cyclically in (hole, j]: it would then be
        // found no more from there.
        for (uint32_t j = (hole + 1) & mask_; slots_[j].key != kEmpty; j = (j + 1) & mask_) {
            const uint32_t h = home(slots_[j].key);
            const bool stays = hole < j ? (h > hole && h <= j) : (h > hole || h <= j);
            if (stays) continue;
            slots_[hole] = std::move(slots_[j]);
            hole = j;
        }
        slots_[hole] = Slot{};
        --size_;
        return true;
    }

    size_t size() const { return size_; }

    // f(key, value) for every entry, in no particular order; f must not
    // change the map.
    template <class F>
    void for_each(F&& f) {
        for (Slot& s : slots_)
            if (s.key != kEmpty) f(s.key, s.value);
    }

    void clear() {
        slots_.clear();
        size_ = 0;
        rehash(kMinBits);
    }

private:
    static constexpr uint32_t kMinBits = 3;
    struct Slot {
        K key = kEmpty;
        V value{};
    };

    // Unsigned: the product wraps mod 2^32 or 2^64.
    uint32_t home(K key) const {
        if constexpr (sizeof(K) == 4)
            return (key * 0x9e3779b1u) >> (32 - bits_);
        else
            return uint32_t((key * 0x9e3779b97f4a7c15ull) >> (64 - bits_));
    }

    void place(K key, V value) {
        uint32_t i = home(key);
        while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
        slots_[i].key = key;
        slots_[i].value = std::move(value);
    }

    void rehash(uint32_t bits) {
        std::vector<Slot> old = std::move(slots_);
        bits_ = bits;
        slots_ = std::vector<Slot>(size_t(1) << bits);  // values may be move-only
        mask_ = uint32_t(slots_.size() - 1);
        for (Slot& s : old)
            if (s.key != kEmpty) place(s.key, std::move(s.value));
    }

    std::vector<Slot> slots_;
    size_t size_ = 0;
    uint32_t bits_ = 0;
    uint32_t mask_ = 0;
};

template <class V>
using FlatU32Map = FlatMap<uint32_t, V>;

}  // namespace vrdma::shim
