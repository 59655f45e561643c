// A map from 32-bit keys to small values, for the lookups every message
// makes (an SGE's key, a request's destination QPN). std::unordered_map
// costs a division by its prime bucket count and a node to chase per
// lookup; this is one array, open addressing with linear probing, indexed
// by a multiplicative hash (the top bits of key * 2^32/phi) of a power of
// two, at most half full. Erase shifts the entries behind the hole back
// instead of leaving tombstones, so that probes stay short however many
// keys come and go (keys and QPNs churn for the life of a shim).
//
// kEmpty is never a key: set() ignores it, find() finds nothing. Pointers
// returned by find() are valid until the next set() or erase().
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace vrdma::shim {

template <class V>
class FlatU32Map {
public:
    static constexpr uint32_t kEmpty = 0xffffffffu;

    FlatU32Map() { rehash(kMinBits); }

    V* find(uint32_t key) {
        if (key == kEmpty) return nullptr;  // a guest may name any number
        for (uint32_t i = home(key);; i = (i + 1) & mask_) {
            Slot& s = slots_[i];
            if (s.key == key) return &s.value;
            if (s.key == kEmpty) return nullptr;
        }
    }
    const V* find(uint32_t key) const { return const_cast<FlatU32Map*>(this)->find(key); }
    bool contains(uint32_t key) const { return find(key) != nullptr; }

    // Inserts `key` or replaces its value.
    void set(uint32_t key, V value) {
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
    bool erase(uint32_t key) {
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

private:
    static constexpr uint32_t kMinBits = 3;
    struct Slot {
        uint32_t key = kEmpty;
        V value{};
    };

    uint32_t home(uint32_t key) const { return (key * 0x9e3779b1u) >> (32 - bits_); }  // unsigned: wraps mod 2^32

    void place(uint32_t key, V value) {
        uint32_t i = home(key);
        while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
        slots_[i].key = key;
        slots_[i].value = std::move(value);
    }

    void rehash(uint32_t bits) {
        std::vector<Slot> old = std::move(slots_);
        bits_ = bits;
        slots_.assign(size_t(1) << bits, Slot{});
        mask_ = uint32_t(slots_.size() - 1);
        for (Slot& s : old)
            if (s.key != kEmpty) place(s.key, std::move(s.value));
    }

    std::vector<Slot> slots_;
    size_t size_ = 0;
    uint32_t bits_ = 0;
    uint32_t mask_ = 0;
};

}  // namespace vrdma::shim
