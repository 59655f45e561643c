// Moving private pages (heap, stack, anonymous mmap, static data and bss,
// MAP_PRIVATE file mappings) onto a memfd the shim maps, at the same
// virtual addresses and with their contents (docs/protocol.md "Guest
// memory").
//
// Anonymous pieces move without losing a concurrent store: the pieces are
// registered with userfaultfd (missing faults), their pages are taken away
// atomically with mremap(MREMAP_DONTUNMAP), copied into the memfd, and the
// memfd is mapped over them. A thread that touches the range meanwhile
// (another thread of the application, the kernel on its behalf) waits in
// the fault until the memfd is in place and then stores into it. The work
// runs on a helper thread, so the calling thread's own stack may be in the
// range. File-backed private pieces (static data, MAP_PRIVATE files) and
// private hugetlb pieces (whose pages mremap(MREMAP_DONTUNMAP) cannot take)
// are copied and remapped instead, and a store by another thread in that
// window can be lost.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vrdma::prov {

struct MovePiece {
    uintptr_t start, end;  // page aligned
    int prot;
    bool dontfork;         // MADV_DONTFORK to keep
    bool anonymous;        // no file behind it (heap, stack, anonymous mmap, bss)
    size_t huge_page;      // a hugetlb piece's page size (its bounds are aligned to it); 0 otherwise
};

// Moves `n` adjacent pieces onto `fd`, whose offset `offset` stands for
// pieces[0].start and which is at least that long past it (a memfd; inside
// a VM, the device's memory). 0 or a positive errno; on error no piece is
// left unmapped (each holds either its old pages or the moved ones).
int move_private_pages(const MovePiece* pieces, size_t n, int fd, uint64_t offset = 0);

}  // namespace vrdma::prov
