#include "proc_maps.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace vrdma::prov {
namespace {

bool read_whole(const char* path, std::string& out) {
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    out.clear();
    char buf[65536];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        out.append(buf, size_t(n));
    }
    ::close(fd);
    return true;
}

bool parse_map_line(const char* line, MapEntry& e) {
    unsigned long start, end, offset, inode;
    char perms[8];
    unsigned maj, min;
    int consumed = 0;
    if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &start, &end, perms, &offset, &maj, &min,
                    &inode, &consumed) < 7)
        return false;
    e.start = start;
    e.end = end;
    e.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
             (perms[2] == 'x' ? PROT_EXEC : 0);
    e.shared = perms[3] == 's';
    e.offset = offset;
    e.dev_major = maj;
    e.dev_minor = min;
    e.inode = inode;
    const char* p = line + consumed;
    const char* nl = std::strchr(p, '\n');
    e.path.assign(p, nl ? size_t(nl - p) : std::strlen(p));
    return true;
}

struct Bias {
    unsigned major, minor;
    uint64_t ino, bias;
};
std::mutex g_bias_mu;
std::vector<Bias> g_biases;

}  // namespace

void add_maps_offset_bias(uint64_t dev, uint64_t ino, uint64_t excess) {
    std::lock_guard lock(g_bias_mu);
    for (Bias& b : g_biases)
        if (b.major == major(dev) && b.minor == minor(dev) && b.ino == ino) {
            b.bias += excess;
            return;
        }
    g_biases.push_back(Bias{major(dev), minor(dev), ino, excess});
}

std::vector<MapEntry> read_maps(bool with_flags) {
    std::vector<MapEntry> out;
    std::string text;
    if (!read_whole(with_flags ? "/proc/self/smaps" : "/proc/self/maps", text)) return out;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        if (with_flags && line.rfind("VmFlags:", 0) == 0) {
            if (!out.empty()) {
                line += ' ';
                out.back().dontfork = line.find(" dc ") != std::string::npos;
                out.back().hugetlb = line.find(" ht ") != std::string::npos;
            }
            continue;
        }
        unsigned long kib = 0;
        if (with_flags && std::sscanf(line.c_str(), "KernelPageSize: %lu kB", &kib) == 1) {
            if (!out.empty()) out.back().page_size = size_t(kib) * 1024;
            continue;
        }
        MapEntry e;
        // smaps detail lines ("Size:   4 kB") do not parse as a range.
        if (line.empty() || !std::isxdigit(static_cast<unsigned char>(line[0]))) continue;
        if (line.find('-') == std::string::npos || line.find(':') == std::string::npos) continue;
        if (parse_map_line(line.c_str(), e)) out.push_back(std::move(e));
    }
    std::lock_guard lock(g_bias_mu);
    for (const Bias& b : g_biases)
        for (MapEntry& e : out)
            if (e.inode == b.ino && e.dev_major == b.major && e.dev_minor == b.minor && e.offset >= b.bias)
                e.offset -= b.bias;
    return out;
}

}  // namespace vrdma::prov
