#include "memory_registration.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "context.h"
#include "fork_child.h"
#include "page_move.h"
#include "proc_maps.h"
#include "shared_object.h"
#include "vrdma/abi.h"
#include "vrdma_common/log.h"

namespace vrdma::prov {
namespace {

constexpr uintptr_t kPage = abi::kPageSize;
constexpr size_t kMoveHeadroom = size_t(1) << 30;

bool same_file(const MapEntry& e, const Segment& s) {
    return e.inode == s.ino && e.dev_major == major(s.dev) && e.dev_minor == minor(s.dev);
}

// Is [e.start, e.end) of this mapping backed by segment s at the right place?
bool backed_by(const MapEntry& e, const Segment& s) {
    return same_file(e, s) && e.shared && e.start >= s.gva && e.end <= s.gva + s.len &&
           e.offset == s.offset + uint64_t(e.start - s.gva);
}

// Inside a VM: whether segment s holds address `at` of mapping e, at the
// right place (e may span several segments: merged mappings of adjacent
// regions of the device's memory).
bool covers_at(const MapEntry& e, const Segment& s, uintptr_t at) {
    return same_file(e, s) && e.shared && at >= s.gva && at < s.gva + s.len && at >= e.start && at < e.end &&
           e.offset + (at - e.start) == s.offset + (at - s.gva);
}

// Inside a VM every segment is on the device's one memory file: a mapping
// of it counts only where it covers the segment's own part.
bool still_mapped(const std::vector<MapEntry>& maps, const Segment& s, bool in_vm) {
    return std::any_of(maps.begin(), maps.end(), [&](const MapEntry& e) {
        return same_file(e, s) &&
               (!in_vm || (e.offset < s.offset + s.len && e.offset + uint64_t(e.end - e.start) > s.offset));
    });
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

// fork(): g_moved is consistent in the child (prepare takes the lock), and
// the child gets private copies of the moved pages (fork_child.h) while the
// forking thread of the parent waits for it to finish copying.
int g_fork_pipe[2] = {-1, -1};

struct VmMovedRun {
    uintptr_t gva;
    size_t len;
    uint64_t offset;  // in the device's memory
    dev_t dev;        // the device's memory file
    ino_t ino;
};
std::vector<VmMovedRun> g_vm_moved;  // inside a VM (below); under g_moved_mu

void fork_prepare() {
    g_moved_mu.lock();
    if ((!g_moved.empty() || !g_vm_moved.empty()) && ::pipe2(g_fork_pipe, O_CLOEXEC) != 0)
        g_fork_pipe[0] = g_fork_pipe[1] = -1;
}

void fork_parent() {
    if (g_fork_pipe[0] >= 0) {
        ::close(g_fork_pipe[1]);
        char c;
        while (::read(g_fork_pipe[0], &c, 1) < 0 && errno == EINTR) {
        }
        ::close(g_fork_pipe[0]);
        g_fork_pipe[0] = g_fork_pipe[1] = -1;
    }
    g_moved_mu.unlock();
}

void fork_child() {
    std::pair<dev_t, ino_t> ids[256];
    size_t n = 0;
    for (const MovedFile& m : g_moved)
        if (n < std::size(ids)) ids[n++] = {m.dev, m.ino};
    MovedRange runs[1024];
    size_t nruns = 0;
    for (const VmMovedRun& r : g_vm_moved)
        if (nruns < std::size(runs)) runs[nruns++] = {r.gva, r.gva + r.len, r.dev, r.ino};
    privatize_after_fork(ids, n, runs, nruns);
    if (g_fork_pipe[0] >= 0) {
        ::close(g_fork_pipe[0]);
        ::close(g_fork_pipe[1]);  // the parent reads end-of-file
        g_fork_pipe[0] = g_fork_pipe[1] = -1;
    }
    g_moved_mu.unlock();
}

void watch_fork() {
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { ::pthread_atfork(fork_prepare, fork_parent, fork_child); });
}

void remember_moved(const Segment& s) {
    watch_fork();
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

// Inside a VM, g_vm_moved: the runs this library moved onto the device's
// memory, process-wide, so that a later context of the process (the first
// one closed, or another one open) registers those pages again: they are
// shared mappings of the device's file now, which a VM process otherwise
// cannot register. The shim accepts a segment anywhere in the VM's
// allocated regions (the VM is one tenant); the region stays the first
// context's owner's until the process exits. A forked child gets private
// copies of them, as of the memfds on a host.
void remember_vm_moved(const Segment& s) {
    watch_fork();
    std::lock_guard lock(g_moved_mu);
    g_vm_moved.push_back(VmMovedRun{s.gva, s.len, s.offset, s.dev, s.ino});
}

// Whether mapping e at address `at` is still where a recorded run put it.
bool maps_vm_run(const MapEntry& e, uintptr_t at, const VmMovedRun& r) {
    return e.shared && at >= r.gva && at < r.gva + r.len && at >= e.start && at < e.end &&
           e.offset + (at - e.start) == r.offset + (at - r.gva);
}

// A new segment for the run that address `at` of mapping e (a mapping of
// the device's memory) lies in, if this process moved it; false otherwise.
bool adopt_vm_moved(Context& ctx, const MapEntry& e, uintptr_t at, Segment& out) {
    struct stat st;
    if (!ctx.in_vm || !e.shared || ::fstat(ctx.vm_bar2.get(), &st) != 0) return false;
    if (e.inode != st.st_ino || e.dev_major != major(st.st_dev) || e.dev_minor != minor(st.st_dev)) return false;
    std::lock_guard lock(g_moved_mu);
    for (const VmMovedRun& r : g_vm_moved) {
        if (!maps_vm_run(e, at, r)) continue;
        out.fd.reset(::fcntl(ctx.vm_bar2.get(), F_DUPFD_CLOEXEC, 0));
        if (!out.fd) return false;
        out.dev = st.st_dev;
        out.ino = st.st_ino;
        out.gva = r.gva;
        out.len = r.len;
        out.offset = r.offset;
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
    std::erase_if(g_vm_moved, [&](const VmMovedRun& r) {
        return std::none_of(maps.begin(), maps.end(), [&](const MapEntry& e) { return maps_vm_run(e, r.gva, r); });
    });
}

// Private memory that can move onto a memfd: anonymous (heap, stacks,
// anonymous mmap, bss), a private file mapping (static data, MAP_PRIVATE
// files) or private hugetlb memory (onto a hugetlb memfd). Not the kernel's
// special mappings.
bool movable(const MapEntry& e) {
    if (e.shared) return false;
    if (e.inode != 0) return true;
    return e.path.empty() || e.path == "[heap]" || e.path == "[stack]" || e.path.rfind("[anon:", 0) == 0 ||
           e.path.rfind("[stack:", 0) == 0;
}

int fill_identity(Segment& s);
int announce_segment(Context& ctx, Segment& s);

bool anonymous(const MapEntry& e) { return e.inode == 0 && e.dev_major == 0 && e.dev_minor == 0; }

const char* why_not_movable(const MapEntry& e) {
    if (!e.path.empty()) return "a special mapping";
    return "memory of an unsupported kind";
}

// A segment for the object behind shared mapping e (the whole mapping, so
// that later registrations inside it reuse the segment).
int share_object(Context& ctx, const MapEntry& e, uintptr_t addr, size_t len, uint32_t* seg_id, const char* verb) {
    Segment s;
    std::string why;
    if (ctx.in_vm) {
        // The shim reaches only the VM device's memory, and a shared
        // mapping's pages cannot move there without unsharing them.
        if (verb)
            LOG_ERR("%s of [0x%" PRIxPTR ", +%zu) refused: 0x%" PRIxPTR
                    " is shared memory (%s), which a process inside a VM cannot register: register private "
                    "memory (docs/protocol.md \"VM tenants\")",
                    verb, addr, len, e.start, e.path.empty() ? "anonymous" : e.path.c_str());
        return EINVAL;
    }
    if (int rc = open_mapped_object(e, s.fd, why)) {
        if (verb)
            LOG_ERR("%s of [0x%" PRIxPTR ", +%zu) refused: 0x%" PRIxPTR
                    " is shared memory (%s) the shim cannot reach: %s",
                    verb, addr, len, e.start, e.path.empty() ? "anonymous" : e.path.c_str(), why.c_str());
        return rc;
    }
    if (int rc = fill_identity(s)) return rc;
    s.id = ctx.segments.next_id++;
    s.gva = e.start;
    s.len = e.end - e.start;
    s.offset = e.offset;
    if (int rc = announce_segment(ctx, s)) return rc;
    *seg_id = s.id;
    ctx.segments.segs.emplace(s.id, std::move(s));
    return 0;
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
        LOG_ERR("the shim refused memory segment [0x%" PRIxPTR ", +%zu): %s",
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
        if (!s.arena && s.refs == 0 && !still_mapped(maps, s, ctx.in_vm)) {
            remove_segment(ctx, s.id);
            it = ctx.segments.segs.erase(it);
        } else {
            ++it;
        }
    }
}

// A memfd (close-on-exec, memfd_create `flags` added) of `size` bytes.
int sized_memfd(const char* name, unsigned flags, uint64_t size, UniqueFd& out) {
    UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | flags));
    if (!fd) return errno;
    if (::ftruncate(fd.get(), off_t(size)) != 0) return errno;
    out = std::move(fd);
    return 0;
}

// A memfd of `size` bytes of hugetlb pages of `page_size` bytes (not
// sealable, so never a ring's: it backs MRs only). memfd_create encodes the
// page size as mmap does (MFD_HUGE_SHIFT == MAP_HUGE_SHIFT).
int create_hugetlb_memfd(uint64_t size, size_t page_size, UniqueFd& out) {
    const unsigned flags = MFD_HUGETLB | (unsigned(std::countr_zero(page_size)) << MAP_HUGE_SHIFT);
    return sized_memfd("vrdma-mr-huge", flags, size, out);
}

// Inside a VM: a region of the device's memory, from the agent (`fd`: the
// device's memory file, `offset`: where the region starts).
int vm_region(Context& ctx, uint64_t len, UniqueFd& fd, uint64_t& offset) {
    abi::SockAddSegment msg{};
    msg.hdr = {abi::kMagic, abi::kVersion, abi::SockOp::VmAlloc, 0};
    msg.len = len;
    abi::SockReply reply{};
    if (int rc = sock_request(ctx, &msg, sizeof(msg), {}, &reply)) {
        LOG_ERR("no room for %zu bytes in the VM device's memory: %s", size_t(len),
                reply.message[0] ? reply.message : std::strerror(rc));
        return rc;
    }
    offset = uint64_t(reply.arg) * kPage;
    fd.reset(::fcntl(ctx.vm_bar2.get(), F_DUPFD_CLOEXEC, 0));
    return fd ? 0 : errno;
}

void vm_region_free(Context& ctx, uint64_t offset) {
    abi::SockAddSegment msg{};
    msg.hdr = {abi::kMagic, abi::kVersion, abi::SockOp::VmFree, 0};
    msg.offset = offset;
    abi::SockReply reply{};
    (void)sock_request(ctx, &msg, sizeof(msg), {}, &reply);
}

// move_run inside a VM: onto a region of the device's memory, as large as
// the run (the region is the VM's, sized by its operator: no headroom),
// hugetlb pieces included. Remembered for later contexts of the process
// and for fork() (g_vm_moved).
int move_run_in_vm(Context& ctx, const std::vector<MovePiece>& run, uint32_t* seg_id) {
    const uintptr_t start = run.front().start;
    const size_t len = run.back().end - start;
    Segment s;
    if (int rc = vm_region(ctx, len, s.fd, s.offset)) return rc;
    int rc = move_private_pages(run.data(), run.size(), s.fd.get(), s.offset);
    if (!rc) rc = fill_identity(s);
    if (!rc) {
        s.id = ctx.segments.next_id++;
        s.gva = start;
        s.len = len;
        rc = announce_segment(ctx, s);
    }
    // On failure the region stays the process's until it goes: pages of the
    // run may be on it already.
    if (rc) return rc;
    *seg_id = s.id;
    remember_vm_moved(s);
    ctx.segments.segs.emplace(s.id, std::move(s));
    return 0;
}

// Moves a run of adjacent private pieces onto one new memfd segment,
// contents preserved (page_move.h). Returns 0 or a positive errno.
int move_run(Context& ctx, const std::vector<MovePiece>& run, uint32_t* seg_id) {
    uintptr_t run_start = run.front().start, run_end = run.back().end;
    size_t len = run_end - run_start;
    Segment s;
    if (ctx.in_vm) return move_run_in_vm(ctx, run, seg_id);
    // The file is longer than the run (sparse, costs nothing): if the
    // application later grows the mapping in place (realloc -> mremap), the
    // new pages exist instead of raising SIGBUS. Hugetlb pages move onto
    // huge pages of the same size (a hugetlb mapping cannot grow in place).
    if (size_t huge = run.front().huge_page) {
        if (int rc = create_hugetlb_memfd(len, huge, s.fd)) return rc;
    } else if (int rc = create_shared_memfd("vrdma-mr", len + kMoveHeadroom, s.fd)) {
        return rc;
    }
    if (int rc = move_private_pages(run.data(), run.size(), s.fd.get())) return rc;
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
    UniqueFd fd;
    if (int rc = sized_memfd(name, MFD_ALLOW_SEALING, size, fd)) return rc;
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) return errno;
    out = std::move(fd);
    return 0;
}

void release_vm_arena_segments(Context& ctx) {
    for (auto& [id, s] : ctx.segments.segs) {
        if (!s.arena || id == 0 || !s.len) continue;
        ::munmap(reinterpret_cast<void*>(s.gva), s.len);
        s.len = 0;
        vm_region_free(ctx, s.offset);
    }
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
    if (ctx.in_vm) {
        if (int rc = vm_region(ctx, len, s.fd, s.offset)) return rc;
    } else if (int rc = create_shared_memfd("vrdma-arena", len, s.fd)) {
        return rc;
    }
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd.get(), off_t(s.offset));
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
        if (ctx.in_vm) vm_region_free(ctx, s.offset);
        return rc;
    }
    ctx.segments.segs.emplace(s.id, std::move(s));
    *base = p;
    return 0;
}

int share_range(Context& ctx, uintptr_t addr, size_t len, std::vector<uint32_t>* seg_ids, const char* verb) {
    if (len == 0 || addr + len < addr) return EINVAL;
    uintptr_t start = addr & ~(kPage - 1);
    uintptr_t end = (addr + len + kPage - 1) & ~(kPage - 1);
    if (end < start) return EINVAL;

    std::vector<MapEntry> maps = read_maps(false);
    if (maps.empty()) {
        if (verb) LOG_ERR("%s: cannot read /proc/self/maps", verb);
        return EFAULT;
    }
    sweep(ctx, maps);

    // Classify [start, end) piece by piece: ours (a live segment) or movable.
    struct Part {
        uintptr_t start, end;
        int prot;
        uint32_t seg;  // valid when ours
        bool ours;
        bool anonymous;
    };
    std::vector<Part> parts;
    uintptr_t cur = start;
    bool need_move = false;
    for (const MapEntry& e : maps) {
        if (e.end <= cur) continue;
        if (cur >= end) break;
        if (e.start > cur) break;  // gap
        // Inside a VM one mapping of the device's memory may span runs
        // moved onto adjacent regions (the kernel merges the mappings): a
        // part per segment then.
        while (cur < std::min(end, e.end)) {
            uintptr_t s = cur, t = std::min(end, e.end);
            Part part{s, t, e.prot, 0, false, anonymous(e)};
            bool found = false;
            for (auto& [id, seg] : ctx.segments.segs) {
                if (backed_by(e, seg) || (ctx.in_vm && covers_at(e, seg, s))) {
                    part.seg = id;
                    part.ours = found = true;
                    if (ctx.in_vm) t = std::min<uintptr_t>(t, seg.gva + seg.len);
                    break;
                }
            }
            Segment adopted;
            if (!found && (adopt_moved(e, adopted) || adopt_vm_moved(ctx, e, s, adopted))) {
                adopted.id = ctx.segments.next_id++;
                if (int rc = announce_segment(ctx, adopted)) return rc;
                part.seg = adopted.id;
                part.ours = found = true;
                if (ctx.in_vm) t = std::min<uintptr_t>(t, adopted.gva + adopted.len);
                ctx.segments.segs.emplace(adopted.id, std::move(adopted));
            }
            if (!found && e.shared) {
                if (int rc = share_object(ctx, e, addr, len, &part.seg, verb)) return rc;
                part.ours = found = true;
            }
            if (!found) {
                if (!movable(e)) {
                    if (verb)
                        LOG_ERR("%s of [0x%" PRIxPTR ", +%zu) refused: 0x%" PRIxPTR
                                " is %s (%s), which cannot be shared with the vrdma shim",
                                verb, addr, len, s, why_not_movable(e), e.path.empty() ? "anonymous" : e.path.c_str());
                    return EINVAL;
                }
                need_move = true;
            }
            part.end = t;
            parts.push_back(part);
            cur = t;
        }
    }
    if (cur < end) {
        if (verb) LOG_ERR("%s of [0x%" PRIxPTR ", +%zu) refused: 0x%" PRIxPTR " is not mapped", verb, addr, len, cur);
        return EFAULT;
    }

    if (need_move) {
        // Re-read with VmFlags and page sizes: which pieces had
        // MADV_DONTFORK, which are hugetlb.
        std::vector<MapEntry> smaps = read_maps(true);
        auto smaps_at = [&](uintptr_t a) -> const MapEntry* {
            for (const MapEntry& e : smaps)
                if (e.start <= a && a < e.end) return &e;
            return nullptr;
        };
        std::vector<MovePiece> run;
        auto flush = [&]() -> int {
            if (run.empty()) return 0;
            uint32_t id = 0;
            int rc = move_run(ctx, run, &id);
            if (rc) {
                if (verb)
                    LOG_ERR("%s: moving [0x%" PRIxPTR ", 0x%" PRIxPTR ") onto shared memory failed: %s", verb,
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
            const MapEntry* e = smaps_at(p.start);
            MovePiece piece{p.start, p.end, p.prot, e && e->dontfork, p.anonymous, 0};
            if (e && e->hugetlb && e->page_size > kPage) {
                // Whole huge pages move, onto huge pages of a memfd of their own.
                piece.huge_page = e->page_size;
                piece.start = p.start & ~uintptr_t(e->page_size - 1);
                piece.end = (p.end + e->page_size - 1) & ~uintptr_t(e->page_size - 1);
                piece.anonymous = false;
            }
            if (!run.empty() && (run.back().end != piece.start || run.back().huge_page != piece.huge_page))
                if (int rc = flush()) return rc;
            run.push_back(piece);
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

void forget_unmapped_segments(Context& ctx) { sweep(ctx, read_maps(false)); }

void retain_segments(Context& ctx, const std::vector<uint32_t>& seg_ids) {
    for (uint32_t id : seg_ids) {
        auto it = ctx.segments.segs.find(id);
        if (it != ctx.segments.segs.end()) it->second.refs++;
    }
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
