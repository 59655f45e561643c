#include "arena.h"

#include <iterator>

namespace vrdma::prov {

void Arena::add_region(uintptr_t base, size_t len) {
    len &= ~(kAlign - 1);
    if (len == 0) return;
    Region r{base, len, {}};
    r.free_blocks.emplace(base, len);
    regions_.push_back(std::move(r));
}

void* Arena::alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    size_t need = (bytes + kAlign - 1) & ~(kAlign - 1);
    if (need < bytes) return nullptr;  // overflow
    for (size_t ri = 0; ri < regions_.size(); ++ri) {
        auto& fb = regions_[ri].free_blocks;
        for (auto it = fb.begin(); it != fb.end(); ++it) {
            if (it->second < need) continue;
            uintptr_t start = it->first;
            size_t rest = it->second - need;
            fb.erase(it);
            if (rest) fb.emplace(start + need, rest);
            used_.emplace(start, std::make_pair(need, ri));
            return reinterpret_cast<void*>(start);
        }
    }
    return nullptr;
}

bool Arena::free(void* p) {
    auto u = used_.find(reinterpret_cast<uintptr_t>(p));
    if (u == used_.end()) return false;
    uintptr_t start = u->first;
    size_t len = u->second.first;
    auto& fb = regions_[u->second.second].free_blocks;
    used_.erase(u);
    auto next = fb.lower_bound(start);
    // Merge with the following free block.
    if (next != fb.end() && start + len == next->first) {
        len += next->second;
        next = fb.erase(next);
    }
    // Merge with the preceding free block.
    if (next != fb.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == start) {
            prev->second += len;
            return true;
        }
    }
    fb.emplace(start, len);
    return true;
}

}  // namespace vrdma::prov
