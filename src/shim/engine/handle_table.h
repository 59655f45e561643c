// Typed, generation-checked handle tables. A handle names one object of one
// type in one context: [type:3][generation:8][slot+1:21]. A freed slot's
// generation advances, so a stale handle (use after free) is rejected, and a
// handle of another type never matches because the type is part of it.
// Freed slots are reused first-in first-out to make generations last.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

namespace vrdma::shim {

enum class HandleType : uint32_t { Xrcd = 0, Pd = 1, Mr = 2, Cq = 3, Qp = 4, Srq = 5, Ah = 6, Mw = 7 };

constexpr uint32_t kHandleSlotBits = 21;
constexpr uint32_t kHandleGenBits = 8;
constexpr uint32_t kHandleMaxSlots = (1u << kHandleSlotBits) - 1;

constexpr uint32_t make_handle(HandleType t, uint32_t gen, uint32_t slot) {
    return (uint32_t(t) << 29) | ((gen & 0xff) << kHandleSlotBits) | (slot + 1);
}

template <typename T, HandleType Type>
class HandleTable {
public:
    explicit HandleTable(uint32_t limit) : limit_(limit < kHandleMaxSlots ? limit : kHandleMaxSlots) {}

    // Returns the new handle, or 0 when the table is at its limit.
    uint32_t insert(std::unique_ptr<T> obj) {
        if (live_ >= limit_) return 0;
        uint32_t slot;
        if (!free_.empty()) {
            slot = free_.front();
            free_.pop_front();
        } else {
            slot = uint32_t(slots_.size());
            slots_.push_back(Slot{});
        }
        slots_[slot].obj = std::move(obj);
        ++live_;
        return make_handle(Type, slots_[slot].gen, slot);
    }

    T* get(uint32_t handle) const {
        uint32_t slot;
        if (!decode(handle, slot)) return nullptr;
        return slots_[slot].obj.get();
    }

    // Removes and returns the object (null if the handle is not live).
    std::unique_ptr<T> erase(uint32_t handle) {
        uint32_t slot;
        if (!decode(handle, slot) || !slots_[slot].obj) return nullptr;
        auto obj = std::move(slots_[slot].obj);
        slots_[slot].gen = (slots_[slot].gen + 1) & 0xff;
        free_.push_back(slot);
        --live_;
        return obj;
    }

    // The slot of a live handle (kNoSlot if it is not one), and the live
    // object in a slot with its handle (null if none): slots are small,
    // dense numbers a guest may name in a bitmap.
    static constexpr uint32_t kNoSlot = 0xffffffffu;
    uint32_t slot_of(uint32_t handle) const {
        uint32_t slot;
        return decode(handle, slot) ? slot : kNoSlot;
    }
    T* at_slot(uint32_t slot, uint32_t& handle) const {
        if (slot >= slots_.size() || !slots_[slot].obj) return nullptr;
        handle = make_handle(Type, slots_[slot].gen, slot);
        return slots_[slot].obj.get();
    }
    uint32_t size() const { return live_; }
    // Slots ever used (live or free): every live object's slot is below.
    uint32_t slot_count() const { return uint32_t(slots_.size()); }
    uint32_t limit() const { return limit_; }

    // Calls f(handle, T&) for every live object. f must not insert or erase.
    template <typename F>
    void for_each(F&& f) const {
        for (uint32_t i = 0; i < slots_.size(); ++i)
            if (slots_[i].obj) f(make_handle(Type, slots_[i].gen, i), *slots_[i].obj);
    }

    // Live handles (a snapshot, safe to erase while iterating over it).
    std::vector<uint32_t> handles() const {
        std::vector<uint32_t> v;
        for_each([&](uint32_t h, T&) { v.push_back(h); });
        return v;
    }

private:
    struct Slot {
        std::unique_ptr<T> obj;
        uint32_t gen = 0;
    };
    bool decode(uint32_t handle, uint32_t& slot) const {
        if ((handle >> 29) != uint32_t(Type)) return false;
        uint32_t s = handle & kHandleMaxSlots;
        if (s == 0 || s > slots_.size()) return false;
        slot = s - 1;
        return ((handle >> kHandleSlotBits) & 0xff) == slots_[slot].gen && slots_[slot].obj != nullptr;
    }

    std::vector<Slot> slots_;
    std::deque<uint32_t> free_;
    uint32_t live_ = 0;
    uint32_t limit_;
};

}  // namespace vrdma::shim
