// Guest memory shared with the shim, never bounced (docs/protocol.md
// "Guest memory"): the table of segments
// announced over the socket, the arena segments rings live in, and
// share_range, the one entry point of registration (ibv_reg_mr; a future
// ibv_rereg_mr calls it too): shared objects are passed as they are
// (shared_object.h), private pages moved onto memfds (page_move.h).
//
// Every function here expects the caller to hold Context::mem_mu.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "vrdma_common/unique_fd.h"

namespace vrdma::prov {

struct Context;

struct Segment {
    uint32_t id = 0;       // 0: the arena given at Attach (never removed)
    uintptr_t gva = 0;
    size_t len = 0;
    uint64_t offset = 0;   // file offset that backs gva
    UniqueFd fd;           // the memfd or shared object (kept open while the shim may use it)
    dev_t dev = 0;         // identity of the file, to recognise its mappings
    ino_t ino = 0;
    uint32_t refs = 0;     // MRs using it
    bool arena = false;    // ring memory: never removed while the context lives
};

struct SegmentTable {
    std::map<uint32_t, Segment> segs;
    uint32_t next_id = 1;
};

// Creates a memfd of `size` bytes for memory shared with the shim: sealable,
// and sealed against shrinking (the shim refuses any other: a file shrunk
// under its mapping would make it fault). Growing stays allowed (move_run
// sizes MR files beyond the range for in-place realloc growth). 0 or errno.
int create_shared_memfd(const char* name, uint64_t size, UniqueFd& out);

// Inside a VM: unmaps the arena's extra segments and gives their regions of
// the device's memory back (at close, while the agent still listens; the
// attach arena the agent frees itself when the process closes the device).
void release_vm_arena_segments(Context& ctx);

// Records the attach arena (id 0) in the table.
void record_attach_arena(Context& ctx, int fd, uintptr_t gva, size_t len);

// Creates a new arena segment of `len` bytes (page multiple), announces it to
// the shim and returns its address. 0 or a positive errno.
int add_arena_segment(Context& ctx, size_t len, void** base);

// Makes [addr, addr+len) shared with the shim: pages already on this
// context's live segments are reused, MAP_SHARED objects are announced as
// they are, private pages (anonymous or file-backed) are moved onto new
// segments. On success appends the ids of the segments the range uses (one
// reference taken on each). 0 or a positive errno, with a message on stderr
// that names the `verb` asking (none when it is null).
int share_range(Context& ctx, uintptr_t addr, size_t len, std::vector<uint32_t>* seg_ids,
                const char* verb = "ibv_reg_mr");

// Removes from the shim the segments no MR uses whose pages are no longer
// mapped (after munmap of memory the application owns: device memory).
void forget_unmapped_segments(Context& ctx);

// Takes one more reference on each segment (an imported MR's own).
void retain_segments(Context& ctx, const std::vector<uint32_t>& seg_ids);

// Drops the references taken by share_range; segments no longer referenced
// and no longer mapped are removed from the shim.
void release_segments(Context& ctx, const std::vector<uint32_t>& seg_ids);

}  // namespace vrdma::prov
