// A context's view of guest memory: the segments (memfd ranges) the guest
// announced, indexed by guest virtual address, and the translation of guest
// ranges into shim pointers.
//
// A newer segment that overlaps older ones replaces them for lookups (the
// older ones are trimmed to what is not overlapped); resources built on the
// older ones keep their mappings alive through shared_ptr.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "quota.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

// One mmap()ed region; unmapped when the last user drops it.
struct Mapping {
    uint8_t* base = nullptr;
    uint64_t len = 0;
    uint64_t gva = 0;                  // guest address of base
    uint64_t file_offset = 0;          // file offset of base (when fd is set)
    std::shared_ptr<UniqueFd> fd;      // the backing file (segments only)
    // A sealed memfd: the guest cannot shrink it, so the shim may read and
    // write it directly (rings, CQs). Any other file (a guest's /dev/shm
    // file, SysV segment, shared anonymous memory) backs MRs only, and every
    // access to it goes through fault_guard.h (the guest may truncate it).
    bool ring_safe = false;
    Charges charges;                   // Mappings/MapBytes of the guest, given back at unmap
    Mapping() = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
};

// Maps `len` bytes of `fd` from `offset` to stand for [gva, gva+len).
// Validates alignment and overflow, and that fd is a regular file whose
// size covers the range. The mapping is ring_safe when fd is a memfd on
// shmem sealed with F_SEAL_SHRINK; `rings` true requires that (the attach
// arena: a file shrunk under a ring would make the shim fault). Charges one
// mapping and `len` bytes to `usage` (if given). Returns 0 or a positive
// errno; `why` (if given) gets a one-line reason.
int map_segment(UniqueFd fd, uint64_t gva, uint64_t len, uint64_t offset, std::shared_ptr<Mapping>& out,
                GuestUsage* usage = nullptr, std::string* why = nullptr, bool rings = false);

// A guest range translated into the shim's address space.
struct HostRange {
    uint8_t* host = nullptr;
    std::shared_ptr<Mapping> keepalive;
};

// Overflow-checked "[addr, addr+len) inside [base, base+base_len)".
constexpr bool range_inside(uint64_t addr, uint64_t len, uint64_t base, uint64_t base_len) {
    if (addr < base) return false;
    uint64_t off = addr - base;
    return off <= base_len && len <= base_len - off;
}

class SegmentTable {
public:
    struct Piece {
        uint64_t gva;
        uint64_t len;
        uint32_t seg_id;
        std::shared_ptr<Mapping> map;
        uint8_t* host() const { return map->base + (gva - map->gva); }
    };

    // seg_id 0 is the arena. Returns EEXIST if seg_id is already in use.
    int insert(uint32_t seg_id, std::shared_ptr<Mapping> map);
    // Returns false if no piece has that id.
    bool remove(uint32_t seg_id);
    bool has(uint32_t seg_id) const;

    // A range entirely inside one segment piece (rings must be). Null if not.
    const Piece* find_within_one(uint64_t gva, uint64_t len) const;
    // Translates a range inside one piece; 0 or EFAULT.
    int translate_one(uint64_t gva, uint64_t len, HostRange& out) const;
    // The same for rings and CQs: only inside a ring_safe piece; 0 or EFAULT.
    int translate_ring(uint64_t gva, uint64_t len, HostRange& out) const;
    // Maps [gva, gva+len) as one contiguous shim range, composing several
    // segments when needed (MRs). 0, EFAULT (not covered), EINVAL, ENOMEM.
    // A composed range is charged to `usage` (1 + pieces mappings, its bytes).
    int map_range(uint64_t gva, uint64_t len, HostRange& out, GuestUsage* usage = nullptr) const;

    size_t piece_count() const { return pieces_.size(); }

private:
    std::map<uint64_t, Piece> pieces_;  // by start gva, non-overlapping
    std::map<uint32_t, uint32_t> ids_;  // seg_id -> number of pieces
};

}  // namespace vrdma::shim
