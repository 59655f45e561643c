#include "memory_registration.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "context.h"
#include "vrdma/abi.h"

namespace vrdma::prov {
namespace {

constexpr uintptr_t kPage = abi::kPageSize;
constexpr size_t kMoveHeadroom = size_t(1) << 30;

struct MapEntry {
    uintptr_t start, end;
    int prot;
    bool shared;
    uint64_t offset;
    unsigned dev_major, dev_minor;
    uint64_t inode;
    std::string path;
    bool dontfork = false;  // from smaps VmFlags "dc"
};

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

// /proc/self/maps (or smaps, which also gives VmFlags), sorted by address.
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
            if (!out.empty()) out.back().dontfork = line.find(" dc") != std::string::npos;
            continue;
        }
        MapEntry e;
        // smaps detail lines ("Size:   4 kB") do not parse as a range.
        if (line.empty() || !std::isxdigit(static_cast<unsigned char>(line[0]))) continue;
        if (line.find('-') == std::string::npos || line.find(':') == std::string::npos) continue;
        if (parse_map_line(line.c_str(), e)) out.push_back(std::move(e));
    }
    return out;
}

bool same_file(const MapEntry& e, const Segment& s) {
    return e.inode == s.ino && e.dev_major == major(s.dev) && e.dev_minor == minor(s.dev);
}

// Is [e.start, e.end) of this mapping backed by segment s at the right place?
bool backed_by(const MapEntry& e, const Segment& s) {
    return same_file(e, s) && e.shared && e.start >= s.gva && e.end <= s.gva + s.len &&
           e.offset == s.offset + uint64_t(e.start - s.gva);
}

bool still_mapped(const std::vector<MapEntry>& maps, const Segment& s) {
    return std::any_of(maps.begin(), maps.end(), [&](const MapEntry& e) { return same_file(e, s); });
}

// Memfds this library moved application pages onto, process-wide: another
// context of the same process (or a later one) finds those pages already
// shared and announces the same file instead of refusing them.
struct MovedFile {
    dev_t dev;
    ino_t ino;
    UniqueFd fd;
};
std::mutex g_moved_mu;
std::vector<MovedFile> g_moved;

void remember_moved(const Segment& s) {
    std::lock_guard lock(g_moved_mu);
    g_moved.push_back(MovedFile{s.dev, s.ino, UniqueFd(::fcntl(s.fd.get(), F_DUPFD_CLOEXEC, 0))});
}

// A new segment for mapping e if its file is one of ours; false otherwise.
bool adopt_moved(const MapEntry& e, Segment& out) {
    if (!e.shared) return false;
    std::lock_guard lock(g_moved_mu);
    for (const MovedFile& m : g_moved) {
        if (e.inode != m.ino || e.dev_major != major(m.dev) || e.dev_minor != minor(m.dev)) continue;
        out.fd.reset(::fcntl(m.fd.get(), F_DUPFD_CLOEXEC, 0));
        if (!out.fd) return false;
        out.dev = m.dev;
        out.ino = m.ino;
        out.gva = e.start;
        out.len = e.end - e.start;
        out.offset = e.offset;
        return true;
    }
    return false;
}

void sweep_moved(const std::vector<MapEntry>& maps) {
    std::lock_guard lock(g_moved_mu);
    std::erase_if(g_moved, [&](const MovedFile& m) {
        return std::none_of(maps.begin(), maps.end(), [&](const MapEntry& e) {
            return e.inode == m.ino && e.dev_major == major(m.dev) && e.dev_minor == minor(m.dev);
        });
    });
}

bool movable(const MapEntry& e) {
    if (e.shared || e.inode != 0 || e.dev_major != 0 || e.dev_minor != 0) return false;
    return e.path.empty() || e.path == "[heap]" || e.path.rfind("[anon:", 0) == 0;
}

const char* why_not_movable(const MapEntry& e) {
    if (e.path.find("anon_hugepage") != std::string::npos) return "hugetlb memory";
    if (e.shared && e.inode != 0) return "shared mapping of a file or shared memory";
    if (e.inode != 0) return "file-backed memory";
    if (e.path == "[stack]") return "the main thread's stack";
    if (!e.path.empty()) return "a special mapping";
    return "memory of an unsupported kind";
}

int remove_segment(Context& ctx, uint32_t id) {
    abi::SockRemoveSegment msg{};
    msg.hdr = {abi::kMagic, abi::kVersion, abi::SockOp::RemoveSegment, 0};
    msg.seg_id = id;
    abi::SockReply reply{};
    return sock_request(ctx, &msg, sizeof(msg), {}, &reply);
}

int announce_segment(Context& ctx, Segment& s) {
    abi::SockAddSegment msg{};
    msg.hdr = {abi::kMagic, abi::kVersion, abi::SockOp::AddSegment, 0};
    msg.gva = s.gva;
    msg.len = s.len;
    msg.offset = s.offset;
    msg.seg_id = s.id;
    abi::SockReply reply{};
    int fds[1] = {s.fd.get()};
    int rc = sock_request(ctx, &msg, sizeof(msg), fds, &reply);
    if (rc)
        std::fprintf(stderr, "libvrdma: the shim refused memory segment [0x%" PRIxPTR ", +%zu): %s\n",
                     s.gva, s.len, reply.message[0] ? reply.message : std::strerror(rc));
    return rc;
}

int fill_identity(Segment& s) {
    struct stat st;
    if (::fstat(s.fd.get(), &st) != 0) return errno;
    s.dev = st.st_dev;
    s.ino = st.st_ino;
    return 0;
}

// Drops unreferenced segments whose pages are no longer mapped.
void sweep(Context& ctx, const std::vector<MapEntry>& maps) {
    sweep_moved(maps);
    for (auto it = ctx.segments.segs.begin(); it != ctx.segments.segs.end();) {
        Segment& s = it->second;
        if (!s.arena && s.refs == 0 && !still_mapped(maps, s)) {
            remove_segment(ctx, s.id);
            it = ctx.segments.segs.erase(it);
        } else {
            ++it;
        }
    }
}

bool page_is_zero(const unsigned char* p) {
    const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
    for (size_t i = 0; i < kPage / sizeof(uint64_t); ++i)
        if (w[i]) return false;
    return true;
}

struct Piece {
    uintptr_t start, end;
    int prot;
    bool dontfork;
};

// Moves a run of adjacent private anonymous pieces onto one new memfd
// segment, contents preserved. Returns 0 or a positive errno.
int move_run(Context& ctx, const std::vector<Piece>& run, uint32_t* seg_id) {
    uintptr_t run_start = run.front().start, run_end = run.back().end;
    size_t len = run_end - run_start;
    Segment s;
    // The file is longer than the run (sparse, costs nothing): if the
    // application later grows the mapping in place (realloc -> mremap), the
    // new pages exist instead of raising SIGBUS.
    if (int rc = create_shared_memfd("vrdma-mr", len + kMoveHeadroom, s.fd)) return rc;
    void* tmp = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd.get(), 0);
    if (tmp == MAP_FAILED) return errno;
    for (const Piece& p : run) {
        if (!(p.prot & PROT_READ) && ::mprotect(reinterpret_cast<void*>(p.start), p.end - p.start,
                                                p.prot | PROT_READ) != 0) {
            int e = errno;
            ::munmap(tmp, len);
            return e;
        }
    }
    auto* dst = static_cast<unsigned char*>(tmp);
    for (uintptr_t a = run_start; a < run_end; a += kPage) {
        auto* src = reinterpret_cast<const unsigned char*>(a);
        if (!page_is_zero(src)) std::memcpy(dst + (a - run_start), src, kPage);
    }
    ::munmap(tmp, len);
    for (const Piece& p : run) {
        void* at = reinterpret_cast<void*>(p.start);
        if (::mmap(at, p.end - p.start, p.prot, MAP_SHARED | MAP_FIXED, s.fd.get(),
                   off_t(p.start - run_start)) == MAP_FAILED)
            return errno;  // (not expected: the range was mapped a moment ago)
        if (p.dontfork) ::madvise(at, p.end - p.start, MADV_DONTFORK);
    }
    if (int rc = fill_identity(s)) return rc;
    s.id = ctx.segments.next_id++;
    s.gva = run_start;
    s.len = len;
    if (int rc = announce_segment(ctx, s)) return rc;
    *seg_id = s.id;
    remember_moved(s);
    ctx.segments.segs.emplace(s.id, std::move(s));
    return 0;
}

}  // namespace

int create_shared_memfd(const char* name, uint64_t size, UniqueFd& out) {
    UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return errno;
    if (::ftruncate(fd.get(), off_t(size)) != 0) return errno;
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) return errno;
    out = std::move(fd);
    return 0;
}

void record_attach_arena(Context& ctx, int fd, uintptr_t gva, size_t len) {
    Segment s;
    s.id = 0;
    s.gva = gva;
    s.len = len;
    s.fd.reset(::dup(fd));
    fill_identity(s);
    s.arena = true;
    ctx.segments.segs.emplace(0, std::move(s));
}

int add_arena_segment(Context& ctx, size_t len, void** base) {
    Segment s;
    if (int rc = create_shared_memfd("vrdma-arena", len, s.fd)) return rc;
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd.get(), 0);
    if (p == MAP_FAILED) return errno;
    if (int rc = fill_identity(s)) {
        ::munmap(p, len);
        return rc;
    }
    s.id = ctx.segments.next_id++;
    s.gva = reinterpret_cast<uintptr_t>(p);
    s.len = len;
    s.arena = true;
    if (int rc = announce_segment(ctx, s)) {
        ::munmap(p, len);
        return rc;
    }
    ctx.segments.segs.emplace(s.id, std::move(s));
    *base = p;
    return 0;
}

int share_range(Context& ctx, uintptr_t addr, size_t len, std::vector<uint32_t>* seg_ids) {
    if (len == 0 || addr + len < addr) return EINVAL;
    uintptr_t start = addr & ~(kPage - 1);
    uintptr_t end = (addr + len + kPage - 1) & ~(kPage - 1);
    if (end < start) return EINVAL;

    std::vector<MapEntry> maps = read_maps(false);
    if (maps.empty()) {
        std::fprintf(stderr, "libvrdma: ibv_reg_mr: cannot read /proc/self/maps\n");
        return EFAULT;
    }
    sweep(ctx, maps);

    // Classify [start, end) piece by piece: ours (a live segment) or movable.
    struct Part {
        uintptr_t start, end;
        int prot;
        uint32_t seg;  // valid when ours
        bool ours;
    };
    std::vector<Part> parts;
    uintptr_t cur = start;
    bool need_move = false;
    for (const MapEntry& e : maps) {
        if (e.end <= cur) continue;
        if (cur >= end) break;
        if (e.start > cur) break;  // gap
        uintptr_t s = cur, t = std::min(end, e.end);
        Part part{s, t, e.prot, 0, false};
        bool found = false;
        for (auto& [id, seg] : ctx.segments.segs) {
            if (backed_by(e, seg)) {
                part.seg = id;
                part.ours = found = true;
                break;
            }
        }
        Segment adopted;
        if (!found && adopt_moved(e, adopted)) {
            adopted.id = ctx.segments.next_id++;
            if (int rc = announce_segment(ctx, adopted)) return rc;
            part.seg = adopted.id;
            part.ours = found = true;
            ctx.segments.segs.emplace(adopted.id, std::move(adopted));
        }
        if (!found) {
            if (!movable(e)) {
                std::fprintf(stderr,
                             "libvrdma: ibv_reg_mr of [0x%" PRIxPTR ", +%zu) refused: 0x%" PRIxPTR
                             " is %s (%s), which cannot be shared with the vrdma shim\n",
                             addr, len, s, why_not_movable(e), e.path.empty() ? "anonymous" : e.path.c_str());
                return EINVAL;
            }
            need_move = true;
        }
        parts.push_back(part);
        cur = t;
    }
    if (cur < end) {
        std::fprintf(stderr,
                     "libvrdma: ibv_reg_mr of [0x%" PRIxPTR ", +%zu) refused: 0x%" PRIxPTR
                     " is not mapped\n",
                     addr, len, cur);
        return EFAULT;
    }

    if (need_move) {
        // Re-read with VmFlags to learn which pieces had MADV_DONTFORK.
        std::vector<MapEntry> smaps = read_maps(true);
        auto dontfork_at = [&](uintptr_t a) {
            for (const MapEntry& e : smaps)
                if (e.start <= a && a < e.end) return e.dontfork;
            return false;
        };
        std::vector<Piece> run;
        auto flush = [&]() -> int {
            if (run.empty()) return 0;
            uint32_t id = 0;
            int rc = move_run(ctx, run, &id);
            if (rc) {
                std::fprintf(stderr,
                             "libvrdma: ibv_reg_mr: moving [0x%" PRIxPTR ", 0x%" PRIxPTR
                             ") onto shared memory failed: %s\n",
                             run.front().start, run.back().end, std::strerror(rc));
                return rc;
            }
            for (Part& p : parts)
                if (!p.ours && p.start >= run.front().start && p.end <= run.back().end) {
                    p.ours = true;
                    p.seg = id;
                }
            run.clear();
            return 0;
        };
        for (const Part& p : parts) {
            if (p.ours) {
                if (int rc = flush()) return rc;
                continue;
            }
            if (!run.empty() && run.back().end != p.start)
                if (int rc = flush()) return rc;
            run.push_back(Piece{p.start, p.end, p.prot, dontfork_at(p.start)});
        }
        if (int rc = flush()) return rc;
    }

    std::set<uint32_t> used;
    for (const Part& p : parts) used.insert(p.seg);
    for (uint32_t id : used) {
        ctx.segments.segs.at(id).refs++;
        seg_ids->push_back(id);
    }
    return 0;
}

void release_segments(Context& ctx, const std::vector<uint32_t>& seg_ids) {
    bool any_free = false;
    for (uint32_t id : seg_ids) {
        auto it = ctx.segments.segs.find(id);
        if (it == ctx.segments.segs.end()) continue;
        if (it->second.refs) it->second.refs--;
        if (it->second.refs == 0 && !it->second.arena) any_free = true;
    }
    if (any_free) sweep(ctx, read_maps(false));
}

}  // namespace vrdma::prov
