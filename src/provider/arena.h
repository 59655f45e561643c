// First-fit allocator for ring memory inside the shared arena segments.
// Pure bookkeeping: no system calls; the caller adds regions (segments the
// shim already knows) and serialises access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace vrdma::prov {

class Arena {
public:
    static constexpr size_t kAlign = 64;

    // [base, base+len) becomes available; base must be kAlign aligned.
    void add_region(uintptr_t base, size_t len);
    // kAlign-aligned block of at least `bytes`, or nullptr when no region has room.
    void* alloc(size_t bytes);
    // Returns false if p was not allocated here.
    bool free(void* p);

private:
    struct Region {
        uintptr_t base;
        size_t len;
        std::map<uintptr_t, size_t> free_blocks;  // start -> length
    };
    std::vector<Region> regions_;
    std::map<uintptr_t, std::pair<size_t, size_t>> used_;  // start -> (length, region index)
};

}  // namespace vrdma::prov
