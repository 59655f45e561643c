// The process's own memory map (/proc/self/maps), the source of truth for
// what backs an address range at ibv_reg_mr time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vrdma::prov {

struct MapEntry {
    uintptr_t start = 0, end = 0;
    int prot = 0;
    bool shared = false;   // 's' in the permissions: MAP_SHARED (files, shm, shared anonymous)
    uint64_t offset = 0;   // file offset of start
    unsigned dev_major = 0, dev_minor = 0;
    uint64_t inode = 0;
    std::string path;
    bool dontfork = false;  // VmFlags "dc" (smaps only)
    bool hugetlb = false;   // VmFlags "ht" (smaps only)
    size_t page_size = 0;   // KernelPageSize (smaps only)
};

// /proc/self/maps, or /proc/self/smaps when `with_flags` (which also gives
// VmFlags), sorted by address; empty if it cannot be read.
std::vector<MapEntry> read_maps(bool with_flags);

// Inside a VM a mapping of the vrdma device's memory (a PCI BAR's sysfs
// resource file) shows as its offset the BAR's address in pages plus the
// file offset. That address, the bias, is taken off the offsets read_maps
// gives for the file (dev, ino), so that they are file offsets as
// everywhere else. `excess`: how far an offset read_maps gives now is above
// the true one; it is added to the file's bias (zero once the bias is known:
// a process's second context measures it on offsets already corrected).
void add_maps_offset_bias(uint64_t dev, uint64_t ino, uint64_t excess);

}  // namespace vrdma::prov
