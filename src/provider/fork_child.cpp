#include "fork_child.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace vrdma::prov {
namespace {

// Until the heap is private again the child must not allocate: its malloc
// would work on pages the parent is still using. So /proc/self/maps is
// read into static memory and parsed in place.
char g_maps[1 << 20];

// Direct system calls: a library interposing on mmap (Open MPI's memory
// hooks) would walk its data on the heap, which is not private yet.
void privatize(uintptr_t start, uintptr_t end, int prot) {
    const size_t len = end - start;
    void* copy = reinterpret_cast<void*>(
        ::syscall(SYS_mmap, nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (copy == MAP_FAILED) return;  // the child keeps sharing this range
    auto* src = reinterpret_cast<unsigned char*>(start);
    if (!(prot & PROT_READ)) ::syscall(SYS_mprotect, src, len, prot | PROT_READ);
    // Page by page, skipping holes of the memfd, so the copy stays sparse.
    for (size_t off = 0; off < len; off += 4096) {
        const uint64_t* w = reinterpret_cast<const uint64_t*>(src + off);
        bool zero = true;
        for (size_t k = 0; k < 4096 / 8 && zero; ++k) zero = w[k] == 0;
        if (!zero) std::memcpy(static_cast<unsigned char*>(copy) + off, src + off, 4096);
    }
    ::syscall(SYS_mprotect, copy, len, prot);
    ::syscall(SYS_mremap, copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, src);
}

}  // namespace

void privatize_after_fork(const std::pair<dev_t, ino_t>* files, size_t n, const MovedRange* ranges,
                          size_t nranges) {
    if (n == 0 && nranges == 0) return;
    int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    size_t used = 0;
    for (;;) {
        ssize_t r = ::read(fd, g_maps + used, sizeof(g_maps) - 1 - used);
        if (r <= 0) break;
        used += size_t(r);
    }
    ::close(fd);
    g_maps[used] = 0;
    // Remapping does not change which lines the text holds: it was read whole.
    for (char* line = g_maps; line && *line;) {
        char* nl = std::strchr(line, '\n');
        if (nl) *nl = 0;
        unsigned long start, end, offset, inode;
        unsigned maj, min;
        char perms[8];
        if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &start, &end, perms, &offset, &maj, &min, &inode) == 7 &&
            perms[3] == 's') {
            for (size_t i = 0; i < n; ++i) {
                if (inode != files[i].second || maj != major(files[i].first) || min != minor(files[i].first)) continue;
                int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                           (perms[2] == 'x' ? PROT_EXEC : 0);
                privatize(start, end, prot);
                break;
            }
            for (size_t i = 0; i < nranges; ++i) {
                const MovedRange& r = ranges[i];
                if (inode != r.ino || maj != major(r.dev) || min != minor(r.dev)) continue;
                const uintptr_t lo = std::max<uintptr_t>(start, r.start);
                const uintptr_t hi = std::min<uintptr_t>(end, r.end);
                if (lo >= hi) continue;
                int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                           (perms[2] == 'x' ? PROT_EXEC : 0);
                privatize(lo, hi, prot);
            }
        }
        line = nl ? nl + 1 : nullptr;
    }
}

}  // namespace vrdma::prov
