#include "page_move.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>

#include "vrdma/abi.h"

namespace vrdma::prov {
namespace {

constexpr uintptr_t kPage = abi::kPageSize;

bool page_is_zero(const unsigned char* p) {
    const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
    for (size_t i = 0; i < kPage / sizeof(uint64_t); ++i)
        if (w[i]) return false;
    return true;
}

// Copies the non-zero pages of [src, src+len) to dst (the memfd stays sparse).
void copy_pages(unsigned char* dst, const unsigned char* src, size_t len) {
    for (size_t off = 0; off < len; off += kPage)
        if (!page_is_zero(src + off)) std::memcpy(dst + off, src + off, kPage);
}

int open_userfaultfd() {
#ifdef SYS_userfaultfd
    // Without UFFD_USER_MODE_ONLY the kernel's own accesses (a read() into
    // the range by another thread) wait too; unprivileged processes may only
    // ask for user-mode faults (vm.unprivileged_userfaultfd = 0).
    int fd = int(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
#ifdef UFFD_USER_MODE_ONLY
    if (fd < 0 && errno == EPERM) fd = int(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
#endif
    if (fd < 0) return -1;
    uffdio_api api{};
    api.api = UFFD_API;
    if (::ioctl(fd, UFFDIO_API, &api) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
#else
    return -1;
#endif
}

// Everything the helper thread needs, in memory of its own (an mmap outside
// the range): after the first page moves it must not touch the range, which
// may hold the caller's stack or the malloc heap around the buffer.
struct Job {
    const MovePiece* pieces;
    size_t n;
    int fd;
    off_t offset;          // where in fd the run starts
    int uffd;              // -1: copy and remap everything
    unsigned char* tmp;    // the memfd, mapped for copying
    unsigned char* scratch;  // where anonymous pages are moved to (reserved)
    int err;
    bool* registered;      // n entries: piece i is registered with userfaultfd
};

// The helper calls the kernel directly: libraries that interpose on mmap
// and friends (Open MPI's memory hooks walk their registration cache, on the
// heap) would touch the range while its pages are away.
void* raw_mmap(void* at, size_t len, int prot, int flags, int fd, off_t off) {
    return reinterpret_cast<void*>(::syscall(SYS_mmap, at, len, prot, flags, fd, off));
}
void* raw_mremap(void* from, size_t len, void* to, int flags) {
    return reinterpret_cast<void*>(::syscall(SYS_mremap, from, len, len, flags, to));
}
int raw_mprotect(void* at, size_t len, int prot) { return int(::syscall(SYS_mprotect, at, len, prot)); }
int raw_madvise(void* at, size_t len, int advice) { return int(::syscall(SYS_madvise, at, len, advice)); }

// Runs on the helper thread. No allocation, no locks, no stdio, no
// interposable libc calls.
void run_job(Job* job) {
    const uintptr_t base = job->pieces[0].start;
    const size_t n = job->n;
    job->err = 0;
    size_t moved = 0;  // pieces whose pages left their addresses
    for (size_t i = 0; i < n; ++i) {
        const MovePiece& p = job->pieces[i];
        const size_t len = p.end - p.start;
        unsigned char* dst = job->tmp + (p.start - base);
        if (job->registered[i]) {
            void* to = job->scratch + (p.start - base);
            if (raw_mremap(reinterpret_cast<void*>(p.start), len, to, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP) ==
                MAP_FAILED) {
                job->err = errno;
                break;
            }
            if (!(p.prot & PROT_READ)) raw_mprotect(to, len, PROT_READ);
            copy_pages(dst, static_cast<unsigned char*>(to), len);
        } else {
            if (!(p.prot & PROT_READ) && raw_mprotect(reinterpret_cast<void*>(p.start), len, p.prot | PROT_READ) != 0) {
                job->err = errno;
                break;
            }
            copy_pages(dst, reinterpret_cast<const unsigned char*>(p.start), len);
        }
        ++moved;
    }
    // Map the memfd over every piece whose pages were taken (and, on
    // success, over all of them): a thread waiting in a fault there then
    // finds the moved contents.
    for (size_t i = 0; i < moved; ++i) {
        const MovePiece& p = job->pieces[i];
        void* at = reinterpret_cast<void*>(p.start);
        if (raw_mmap(at, p.end - p.start, p.prot, MAP_SHARED | MAP_FIXED, job->fd, job->offset + off_t(p.start - base)) ==
            MAP_FAILED) {
            if (!job->err) job->err = errno;  // (not expected: the range was mapped a moment ago)
            continue;
        }
        if (p.dontfork) raw_madvise(at, p.end - p.start, MADV_DONTFORK);
    }
    if (job->uffd >= 0) {
        // Pieces left in place after an error leave userfaultfd's watch.
        for (size_t i = moved; i < n; ++i) {
            if (!job->registered[i]) continue;
            uffdio_range r{job->pieces[i].start, job->pieces[i].end - job->pieces[i].start};
            ::ioctl(job->uffd, UFFDIO_UNREGISTER, &r);
        }
        uffdio_range all{base, job->pieces[n - 1].end - base};
        ::ioctl(job->uffd, UFFDIO_WAKE, &all);
    }
}

}  // namespace

int move_private_pages(const MovePiece* pieces, size_t n, int fd, uint64_t offset) {
    if (n == 0) return 0;
    const uintptr_t base = pieces[0].start;
    const size_t len = pieces[n - 1].end - base;
    const size_t job_bytes = sizeof(Job) + n * sizeof(bool) + alignof(MovePiece) + n * sizeof(MovePiece);
    void* jm = ::mmap(nullptr, job_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (jm == MAP_FAILED) return errno;
    Job* job = static_cast<Job*>(jm);
    auto* copy = reinterpret_cast<MovePiece*>(reinterpret_cast<unsigned char*>(jm) + sizeof(Job) + n * sizeof(bool));
    copy = reinterpret_cast<MovePiece*>((reinterpret_cast<uintptr_t>(copy) + alignof(MovePiece) - 1) &
                                        ~uintptr_t(alignof(MovePiece) - 1));
    std::memcpy(copy, pieces, n * sizeof(MovePiece));
    job->pieces = copy;
    job->n = n;
    job->fd = fd;
    job->offset = off_t(offset);
    job->err = 0;
    job->uffd = -1;
    job->tmp = nullptr;
    job->scratch = nullptr;
    job->registered = reinterpret_cast<bool*>(reinterpret_cast<unsigned char*>(jm) + sizeof(Job));
    int err = 0;
    void* tmp = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(offset));
    void* scratch = ::mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (tmp == MAP_FAILED || scratch == MAP_FAILED) err = errno;
    bool any_anon = false;
    for (size_t i = 0; i < n; ++i) any_anon |= pieces[i].anonymous;
    if (!err) {
        job->tmp = static_cast<unsigned char*>(tmp);
        job->scratch = static_cast<unsigned char*>(scratch);
        job->uffd = any_anon ? open_userfaultfd() : -1;
        for (size_t i = 0; i < n; ++i) {
            job->registered[i] = false;
            if (job->uffd < 0 || !copy[i].anonymous) continue;
            uffdio_register reg{};
            reg.range = {copy[i].start, copy[i].end - copy[i].start};
            reg.mode = UFFDIO_REGISTER_MODE_MISSING;
            job->registered[i] = ::ioctl(job->uffd, UFFDIO_REGISTER, &reg) == 0;
        }
        // A thread of its own: the caller's stack may be among the pages.
        try {
            std::thread helper(run_job, job);
            helper.join();
            err = job->err;
        } catch (const std::system_error&) {
            err = EAGAIN;  // no page has moved (closing uffd unregisters)
        }
        if (job->uffd >= 0) ::close(job->uffd);
    }
    if (tmp != MAP_FAILED) ::munmap(tmp, len);
    if (scratch != MAP_FAILED) ::munmap(scratch, len);
    ::munmap(jm, job_bytes);
    return err;
}

}  // namespace vrdma::prov
