// fork() after ibv_reg_mr: pages that registration moved onto memfds are
// MAP_SHARED, so a forked child would share them with its parent (its heap,
// its static data) where it ought to have a private copy. In the child,
// right after fork, every such range gets back a private copy of its
// contents at the same address; the parent's registrations are untouched
// (docs/protocol.md "Guest memory", verbs_memory_test.cpp "[fork]").
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace vrdma::prov {

// Runs in the child: replaces each mapping of the files named (dev, ino)
// by private anonymous memory with the same contents and protection.
// Inside a VM the moved pages are on the device's one memory file, beside
// the contexts' arenas: `ranges` say which parts of its mappings to replace.
struct MovedRange {
    uintptr_t start, end;
    dev_t dev;  // the file they were moved onto
    ino_t ino;
};
void privatize_after_fork(const std::pair<dev_t, ino_t>* files, size_t n, const MovedRange* ranges = nullptr,
                          size_t nranges = 0);

}  // namespace vrdma::prov
