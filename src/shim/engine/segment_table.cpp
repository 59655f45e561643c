#include "segment_table.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <cerrno>
#include <vector>

#include "vrdma/abi.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {

Mapping::~Mapping() {
    if (base) ::munmap(base, len);
}

int map_segment(UniqueFd fd, uint64_t gva, uint64_t len, uint64_t offset, std::shared_ptr<Mapping>& out,
                GuestUsage* usage, std::string* why, bool rings) {
    constexpr uint64_t page = abi::kPageSize;
    auto refuse = [&](int err, const char* reason) {
        if (why) *why = reason;
        return err;
    };
    if (!fd) return refuse(EBADF, "no file descriptor");
    if (len == 0 || gva % page || len % page || offset % page)
        return refuse(EINVAL, "address, length and offset must be nonzero page multiples");
    if (gva + len < gva || gva == 0 || offset + len < offset || offset + len > uint64_t(INT64_MAX))
        return refuse(EINVAL, "range wraps around");
    if (len > (1ull << 46)) return refuse(EINVAL, "segment longer than 64 TiB");
    struct stat st;
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return refuse(EINVAL, "not a regular file");
    // Ring memory must be a memfd on shmem sealed against shrinking: the
    // shim reads rings without a fault guard. Seals are never removed, so
    // checking them before the size is enough.
    struct statfs sfs;
    const bool shmem = ::fstatfs(fd.get(), &sfs) == 0 && sfs.f_type == TMPFS_MAGIC;
    int seals = shmem ? ::fcntl(fd.get(), F_GET_SEALS) : -1;
    const bool sealed = seals >= 0 && (seals & F_SEAL_SHRINK);
    if (rings && !shmem) return refuse(EINVAL, "not a memfd on shmem");
    if (rings && !sealed)
        return refuse(EPERM, "memfd not sealed with F_SEAL_SHRINK (create it with MFD_ALLOW_SEALING and seal it)");
    if (::fstat(fd.get(), &st) != 0) return refuse(EINVAL, "fstat failed");
    // A guest may map a file beyond its end (the pages there are not
    // accessible to it either); only ring memory must be backed whole.
    if ((rings || sealed) && uint64_t(st.st_size) < offset + len)
        return refuse(EINVAL, "file smaller than offset + length");
    auto m = std::make_shared<Mapping>();
    m->charges.bind(usage);
    if (!m->charges.take(Res::Mappings, 1, "a memory segment") || !m->charges.take(Res::MapBytes, len, "a memory segment"))
        return refuse(ENOMEM, "quota of mapped guest memory reached");
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), off_t(offset));
    if (p == MAP_FAILED) return refuse(errno == ENOMEM ? ENOMEM : EINVAL, "mmap failed");
    m->base = static_cast<uint8_t*>(p);
    m->len = len;
    m->gva = gva;
    m->file_offset = offset;
    m->ring_safe = shmem && sealed;
    m->fd = std::make_shared<UniqueFd>(std::move(fd));
    out = std::move(m);
    return 0;
}

int SegmentTable::insert(uint32_t seg_id, std::shared_ptr<Mapping> map) {
    if (ids_.count(seg_id)) return EEXIST;
    const uint64_t start = map->gva, end = map->gva + map->len;
    // Trim every older piece that overlaps [start, end).
    std::vector<Piece> keep;
    auto it = pieces_.lower_bound(start);
    if (it != pieces_.begin()) --it;
    while (it != pieces_.end() && it->second.gva < end) {
        Piece& p = it->second;
        uint64_t pend = p.gva + p.len;
        if (pend <= start) {
            ++it;
            continue;
        }
        if (p.gva < start) keep.push_back(Piece{p.gva, start - p.gva, p.seg_id, p.map});
        if (pend > end) keep.push_back(Piece{end, pend - end, p.seg_id, p.map});
        if (--ids_[p.seg_id] == 0) ids_.erase(p.seg_id);
        it = pieces_.erase(it);
    }
    for (auto& p : keep) {
        ++ids_[p.seg_id];
        pieces_.emplace(p.gva, std::move(p));
    }
    ++ids_[seg_id];
    pieces_.emplace(start, Piece{start, map->len, seg_id, std::move(map)});
    return 0;
}

bool SegmentTable::remove(uint32_t seg_id) {
    if (!ids_.count(seg_id)) return false;
    for (auto it = pieces_.begin(); it != pieces_.end();)
        it = it->second.seg_id == seg_id ? pieces_.erase(it) : std::next(it);
    ids_.erase(seg_id);
    return true;
}

bool SegmentTable::has(uint32_t seg_id) const { return ids_.count(seg_id) != 0; }

const SegmentTable::Piece* SegmentTable::find_within_one(uint64_t gva, uint64_t len) const {
    auto it = pieces_.upper_bound(gva);
    if (it == pieces_.begin()) return nullptr;
    --it;
    const Piece& p = it->second;
    return range_inside(gva, len, p.gva, p.len) ? &p : nullptr;
}

int SegmentTable::translate_one(uint64_t gva, uint64_t len, HostRange& out) const {
    const Piece* p = find_within_one(gva, len);
    if (!p) return EFAULT;
    out.host = p->host() + (gva - p->gva);
    out.keepalive = p->map;
    return 0;
}

int SegmentTable::translate_ring(uint64_t gva, uint64_t len, HostRange& out) const {
    const Piece* p = find_within_one(gva, len);
    if (!p || !p->map->ring_safe) return EFAULT;
    out.host = p->host() + (gva - p->gva);
    out.keepalive = p->map;
    return 0;
}

int SegmentTable::map_range(uint64_t gva, uint64_t len, HostRange& out, GuestUsage* usage) const {
    constexpr uint64_t page = abi::kPageSize;
    if (len == 0 || gva + len < gva || gva + len > UINT64_MAX - page) return EINVAL;
    if (translate_one(gva, len, out) == 0) return 0;
    const uint64_t astart = gva & ~(page - 1);
    const uint64_t aend = (gva + len + page - 1) & ~(page - 1);
    // Collect the pieces covering [astart, aend); they must be contiguous.
    std::vector<const Piece*> parts;
    uint64_t cur = astart;
    auto it = pieces_.upper_bound(cur);
    if (it == pieces_.begin()) return EFAULT;
    --it;
    while (cur < aend) {
        if (it == pieces_.end()) return EFAULT;
        const Piece& p = it->second;
        if (!(p.gva <= cur && cur < p.gva + p.len)) return EFAULT;
        parts.push_back(&p);
        cur = p.gva + p.len;
        ++it;
    }
    const uint64_t total = aend - astart;
    auto m = std::make_shared<Mapping>();
    m->charges.bind(usage);
    if (!m->charges.take(Res::Mappings, 1 + parts.size(), "a memory region over several segments") ||
        !m->charges.take(Res::MapBytes, total, "a memory region over several segments"))
        return ENOMEM;
    void* base = ::mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return ENOMEM;
    m->base = static_cast<uint8_t*>(base);
    m->len = total;
    m->gva = astart;
    for (const Piece* p : parts) {
        uint64_t from = std::max(p->gva, astart);
        uint64_t to = std::min(p->gva + p->len, aend);
        uint64_t foff = p->map->file_offset + (from - p->map->gva);
        void* at = m->base + (from - astart);
        void* r = ::mmap(at, to - from, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->map->fd->get(),
                         off_t(foff));
        if (r == MAP_FAILED) return ENOMEM;  // m unmaps the whole reservation
    }
    out.host = m->base + (gva - astart);
    out.keepalive = std::move(m);
    return 0;
}

}  // namespace vrdma::shim
