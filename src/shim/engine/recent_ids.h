// Numbers handed out recently and freed: a number a tenant saw (a QPN, an
// rkey) is not handed out again until `capacity` other numbers have been
// freed after it, so a stale number names nothing rather than a newcomer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_set>

namespace vrdma::shim {

class RecentIds {
public:
    explicit RecentIds(size_t capacity) : capacity_(capacity) {}

    void add(uint32_t id) {
        if (capacity_ == 0) return;
        if (order_.size() >= capacity_) {
            ids_.erase(order_.front());
            order_.pop_front();
        }
        if (ids_.insert(id).second) order_.push_back(id);
    }
    bool contains(uint32_t id) const { return ids_.count(id) != 0; }
    size_t size() const { return order_.size(); }

private:
    size_t capacity_;
    std::deque<uint32_t> order_;
    std::unordered_set<uint32_t> ids_;
};

}  // namespace vrdma::shim
