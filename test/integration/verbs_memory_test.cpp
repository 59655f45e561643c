// ibv_reg_mr on every kind of memory a process can address (issue 10,
// docs/protocol.md "Guest memory"): each kind is registered on vrdma0 and
// data moves into and out of it from the peer guest by send/recv, RDMA
// write and RDMA read; memory another process writes is seen both ways;
// stores by other threads during registration are not lost; a guest that
// truncates registered shared memory gets error completions while
// everything else keeps working.
#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "verbs_fixture.h"

using namespace vt;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kLen = 3 * 4096 + 123;  // crosses pages, ends mid-page

// Static data (its first pages come from the program file) and bss.
uint8_t g_data[4 * 4096 + 200] = {1, 2, 3};
uint8_t g_bss[4 * 4096 + 200];

ibv_sge mr_sge(ibv_mr* mr, const void* p, size_t len) {
    return ibv_sge{reinterpret_cast<uint64_t>(p), uint32_t(len), mr->lkey};
}

// Moves verified data out of and into [mem, mem+len) (registered on
// `dev`) from a buffer of the peer guest: send/recv both ways, RDMA write
// into it, RDMA read out of it.
void exercise(Device& dev, Device& peer, uint8_t* mem, size_t len, const char* what) {
    INFO(what);
    ibv_mr* mr = ibv_reg_mr(dev.pd, mem, len, kAll);
    REQUIRE(mr != nullptr);
    RcPair p(dev, peer);
    Buffer other(peer.pd, len, kAll);

    // send out of it
    pattern(mem, len, 1);
    REQUIRE(post_recv(p.b.qp, 1, {sge(other, 0, uint32_t(len))}) == 0);
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    REQUIRE(post_send(p.a.qp, wr, {mr_sge(mr, mem, len)}) == 0);
    CHECK(complete(p.a.send_cq) == IBV_WC_SUCCESS);
    CHECK(complete(p.b.recv_cq) == IBV_WC_SUCCESS);
    CHECK(has_pattern(other.data, len, 1));

    // receive into it
    pattern(other.data, len, 2);
    REQUIRE(post_recv(p.a.qp, 2, {mr_sge(mr, mem, len)}) == 0);
    REQUIRE(post_send(p.b.qp, wr, {sge(other, 0, uint32_t(len))}) == 0);
    CHECK(complete(p.b.send_cq) == IBV_WC_SUCCESS);
    CHECK(complete(p.a.recv_cq) == IBV_WC_SUCCESS);
    CHECK(has_pattern(mem, len, 2));

    // RDMA write into it
    pattern(other.data, len, 3);
    CHECK(peer_rdma(p, IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(mem), mr->rkey, other, len) == IBV_WC_SUCCESS);
    CHECK(has_pattern(mem, len, 3));

    // RDMA read out of it
    pattern(mem, len, 4);
    CHECK(peer_rdma(p, IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(mem), mr->rkey, other, len) == IBV_WC_SUCCESS);
    CHECK(has_pattern(other.data, len, 4));
    CHECK(ibv_dereg_mr(mr) == 0);
}

// A SysV shared memory segment of `len` bytes (shmget `flags` added),
// attached and already marked for removal.
uint8_t* sysv_segment(size_t len, int flags) {
    int id = shmget(IPC_PRIVATE, len, IPC_CREAT | flags | 0600);
    REQUIRE(id >= 0);
    void* m = shmat(id, nullptr, 0);
    shmctl(id, IPC_RMID, nullptr);
    REQUIRE(m != reinterpret_cast<void*>(-1));
    return static_cast<uint8_t*>(m);
}

// The file `fd`, made `len` bytes long and mapped whole (mmap `flags`),
// then closed.
uint8_t* map_sized_file(int fd, size_t len, int flags) {
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, off_t(len)) == 0);
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, fd, 0);
    REQUIRE(p != MAP_FAILED);
    close(fd);
    return static_cast<uint8_t*>(p);
}

// A /dev/shm file of `len` bytes, mapped shared, closed and unlinked, the
// way Open MPI's osc rdma makes its windows.
uint8_t* unlinked_shm_file(size_t len) {
    std::string name = "/vrdma-mem-test-" + std::to_string(getpid());
    uint8_t* p = map_sized_file(shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600), len, MAP_SHARED);
    shm_unlink(name.c_str());
    return p;
}

}  // namespace

TEST_CASE("ibv_reg_mr takes private memory of every kind", "[memory]") {
    Device dev, peer(Device::kPeer);
    SECTION("static data") { exercise(dev, peer, g_data + 100, kLen, "static data"); }
    SECTION("bss") { exercise(dev, peer, g_bss + 100, kLen, "bss"); }
    SECTION("stack") {
        // On a thread of its own: a thread whose stack pages were moved
        // must not fork (docs/protocol.md), and this program forks later.
        std::thread t([&] {
            alignas(64) uint8_t on_stack[kLen + 64];
            exercise(dev, peer, on_stack + 7, kLen, "stack");
        });
        t.join();
    }
    SECTION("small heap (brk)") {
        std::vector<uint8_t> v(kLen + 1);
        exercise(dev, peer, v.data() + 1, kLen, "heap");
    }
    SECTION("large heap (mmap)") {
        std::vector<uint8_t> v(4 << 20);
        exercise(dev, peer, v.data() + (1 << 20), kLen, "large heap");
    }
    SECTION("transparent huge pages") {
        const size_t huge = 2 << 20;
        auto* raw = static_cast<uint8_t*>(
            mmap(nullptr, 2 * huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        REQUIRE(raw != MAP_FAILED);
        auto* m = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + huge - 1) & ~(huge - 1));
        madvise(m, huge, MADV_HUGEPAGE);  // a hint: the test holds whether or not the kernel complies
        std::memset(m, 1, huge);
        exercise(dev, peer, m + 12345, kLen, "transparent huge pages");
        munmap(raw, 2 * huge);
    }
    SECTION("MAP_PRIVATE file") {
        char path[] = "/tmp/vrdma-mem-XXXXXX";
        uint8_t* m = map_sized_file(mkstemp(path), 8 * 4096, MAP_PRIVATE);
        unlink(path);
        exercise(dev, peer, m + 4000, kLen, "MAP_PRIVATE file");
        munmap(m, 8 * 4096);
    }
}

TEST_CASE("ibv_reg_mr takes shared memory of every kind", "[memory]") {
    Device dev, peer(Device::kPeer);
    const size_t len = 16 * 4096;
    SECTION("unlinked /dev/shm file") {
        uint8_t* m = unlinked_shm_file(len);
        exercise(dev, peer, m + 50, kLen, "/dev/shm file");
        munmap(m, len);
    }
    SECTION("memfd") {
        uint8_t* m = map_sized_file(memfd_create("vrdma-mem-test", MFD_CLOEXEC), len, MAP_SHARED);
        exercise(dev, peer, m + 4096, kLen, "memfd");
        munmap(m, len);
    }
    SECTION("SysV shared memory") {
        uint8_t* m = sysv_segment(len, 0);
        exercise(dev, peer, m + 8, kLen, "SysV shm");
        shmdt(m);
    }
    SECTION("a range over anonymous, memfd and /dev/shm pages, registered twice") {
        auto* m = static_cast<uint8_t*>(
            mmap(nullptr, 6 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        REQUIRE(m != MAP_FAILED);
        int fd = memfd_create("vrdma-mem-mix", MFD_CLOEXEC);
        REQUIRE(ftruncate(fd, 4096) == 0);
        REQUIRE(mmap(m + 2 * 4096, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED);
        close(fd);
        uint8_t* shm = unlinked_shm_file(8192);
        REQUIRE(mremap(shm + 4096, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, m + 4 * 4096) != MAP_FAILED);
        munmap(shm, 4096);
        ibv_mr* first = ibv_reg_mr(dev.pd, m + 100, 5 * 4096, kAll);
        REQUIRE(first != nullptr);
        exercise(dev, peer, m + 100, 5 * 4096, "anonymous + memfd + /dev/shm, second registration");
        CHECK(ibv_dereg_mr(first) == 0);
        munmap(m, 6 * 4096);
    }
}

// Huge pages of every kind, where the host has them reserved
// (/proc/sys/vm/nr_hugepages; scripts/test.sh reserves some when it runs
// as root). Each section needs at most 4 free 2 MiB pages: the private kind
// is moved onto huge pages of a memfd, and its old pages are freed only
// after the move.
namespace {

constexpr size_t kHuge = 2 << 20;

long free_huge_pages() {
    FILE* f = std::fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
    if (!f) return 0;
    long n = 0;
    if (std::fscanf(f, "%ld", &n) != 1) n = 0;
    std::fclose(f);
    return n;
}

// The mount point of a hugetlbfs of 2 MiB pages (VRDMA_TEST_HUGETLBFS, set
// by scripts/test.sh, else the first in /proc/mounts), or "".
std::string hugetlbfs_mount() {
    if (const char* dir = std::getenv("VRDMA_TEST_HUGETLBFS"); dir && *dir) return dir;
    FILE* f = std::fopen("/proc/mounts", "r");
    if (!f) return "";
    char dev[256], dir[256], type[64], opts[512];
    std::string found;
    while (std::fscanf(f, "%255s %255s %63s %511s %*d %*d", dev, dir, type, opts) == 4)
        if (std::string(type) == "hugetlbfs" && std::string(opts).find("pagesize=1G") == std::string::npos) {
            found = dir;
            break;
        }
    std::fclose(f);
    return found;
}

}  // namespace

TEST_CASE("ibv_reg_mr takes huge pages of every kind", "[memory][hugetlb]") {
    if (free_huge_pages() < 4) {
        WARN("skipped: fewer than 4 free 2 MiB huge pages (reserve some in /proc/sys/vm/nr_hugepages)");
        return;
    }
    Device dev, peer(Device::kPeer);
    const size_t len = 2 * kHuge;
    const size_t span = kHuge / 2 + 99;  // from a quarter before a huge page boundary
    SECTION("MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB") {
        void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        REQUIRE(m != MAP_FAILED);
        exercise(dev, peer, static_cast<uint8_t*>(m) + kHuge - kHuge / 4, span, "shared hugetlb");
        munmap(m, len);
    }
    SECTION("MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB") {
        void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        REQUIRE(m != MAP_FAILED);
        std::memset(m, 7, len);
        exercise(dev, peer, static_cast<uint8_t*>(m) + kHuge - kHuge / 4, span, "private hugetlb");
        munmap(m, len);
    }
    SECTION("SysV SHM_HUGETLB") {
        uint8_t* m = sysv_segment(len, SHM_HUGETLB);
        exercise(dev, peer, m + 8, span, "SysV SHM_HUGETLB");
        shmdt(m);
    }
    for (int flags : {MAP_SHARED, MAP_PRIVATE}) {
        DYNAMIC_SECTION("a file on hugetlbfs, unlinked, " << (flags == MAP_SHARED ? "MAP_SHARED" : "MAP_PRIVATE")) {
            std::string dir = hugetlbfs_mount();
            if (dir.empty()) {
                WARN("skipped: no hugetlbfs mounted");
                return;
            }
            std::string path = dir + "/vrdma-mem-test-" + std::to_string(getpid());
            uint8_t* m = map_sized_file(open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600), len, flags);
            unlink(path.c_str());
            exercise(dev, peer, m + 4096, span, "hugetlbfs file");
            munmap(m, len);
        }
    }
}

TEST_CASE("shared memory another process writes is seen both ways", "[memory]") {
    Device dev, peer(Device::kPeer);
    const size_t len = 4 * 4096;
    for (bool anonymous : {true, false}) {
        INFO((anonymous ? "MAP_SHARED|MAP_ANONYMOUS" : "unlinked /dev/shm file"));
        auto* m = anonymous ? static_cast<uint8_t*>(mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0))
                            : unlinked_shm_file(len);
        REQUIRE(m != MAP_FAILED);
        auto* flag = reinterpret_cast<std::atomic<uint32_t>*>(m + len - 64);
        flag->store(0);
        pid_t child = fork();
        if (child == 0) {
            // The child: writes a pattern, then waits for the peer's write
            // and checks it.
            pattern(m, 4096, 9);
            flag->store(1);
            for (int i = 0; i < 5000 && flag->load() != 2; ++i) usleep(1000);
            _exit(flag->load() == 2 && has_pattern(m + 4096, 4096, 10) ? 0 : 1);
        }
        REQUIRE(child > 0);
        ibv_mr* mr = ibv_reg_mr(dev.pd, m, len, kAll);
        REQUIRE(mr != nullptr);
        for (int i = 0; i < 5000 && flag->load() != 1; ++i) usleep(1000);
        REQUIRE(flag->load() == 1);
        RcPair p(dev, peer);
        Buffer other(peer.pd, 4096, kAll);
        ibv_send_wr w{};
        w.opcode = IBV_WR_RDMA_READ;
        w.send_flags = IBV_SEND_SIGNALED;
        w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(m);
        w.wr.rdma.rkey = mr->rkey;
        REQUIRE(post_send(p.b.qp, w, {sge(other, 0, 4096)}) == 0);
        CHECK(complete(p.b.send_cq) == IBV_WC_SUCCESS);
        CHECK(has_pattern(other.data, 4096, 9));  // what the child wrote
        pattern(other.data, 4096, 10);
        w.opcode = IBV_WR_RDMA_WRITE;
        w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(m + 4096);
        REQUIRE(post_send(p.b.qp, w, {sge(other, 0, 4096)}) == 0);
        CHECK(complete(p.b.send_cq) == IBV_WC_SUCCESS);
        flag->store(2);
        int status = -1;
        REQUIRE(waitpid(child, &status, 0) == child);
        CHECK(status == 0);  // the child saw the peer's write
        CHECK(ibv_dereg_mr(mr) == 0);
        munmap(m, len);
    }
}

TEST_CASE("ibv_reg_mr loses no store of threads writing the memory meanwhile", "[memory]") {
    Device dev;
    constexpr size_t kBufs = 6, kBytes = 1 << 20, kWriters = 2;
    std::vector<uint64_t*> bufs;
    for (size_t i = 0; i < kBufs; ++i) {
        void* m = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(m != MAP_FAILED);
        bufs.push_back(static_cast<uint64_t*>(m));
    }
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> lost{0}, rounds{0};
    auto writer = [&](size_t w) {
        // Each round stores the round number into every slot of this
        // writer's share of every buffer, then checks them all.
        const size_t slots = kBytes / 8 / kWriters;
        for (uint64_t r = 1; !stop.load(); ++r) {
            for (uint64_t* b : bufs)
                for (size_t k = 0; k < slots; ++k) reinterpret_cast<volatile uint64_t*>(b)[w * slots + k] = r;
            for (uint64_t* b : bufs)
                for (size_t k = 0; k < slots; ++k)
                    if (reinterpret_cast<volatile uint64_t*>(b)[w * slots + k] != r) lost.fetch_add(1);
            rounds.fetch_add(1);
        }
    };
    std::vector<std::thread> ts;
    for (size_t w = 0; w < kWriters; ++w) ts.emplace_back(writer, w);
    while (rounds.load() < 2) std::this_thread::yield();
    std::vector<ibv_mr*> mrs;
    for (uint64_t* b : bufs) {
        mrs.push_back(ibv_reg_mr(dev.pd, b, kBytes, kAll));
        CHECK(mrs.back() != nullptr);
    }
    uint64_t at_end = rounds.load();
    while (rounds.load() < at_end + 2) std::this_thread::yield();
    stop = true;
    for (auto& t : ts) t.join();
    CHECK(lost.load() == 0);
    for (ibv_mr* mr : mrs)
        if (mr) ibv_dereg_mr(mr);
    for (uint64_t* b : bufs) munmap(b, kBytes);
}

TEST_CASE("truncated shared memory under an MR fails only the transfers that touch it", "[memory]") {
    Device dev, peer(Device::kPeer);
    const size_t len = 8 * 4096;
    std::string name = "/vrdma-mem-trunc-" + std::to_string(getpid());
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    shm_unlink(name.c_str());
    REQUIRE(ftruncate(fd, off_t(len)) == 0);
    auto* m = static_cast<uint8_t*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    REQUIRE(m != MAP_FAILED);
    ibv_mr* mr = ibv_reg_mr(dev.pd, m, len, kAll);
    REQUIRE(mr != nullptr);
    REQUIRE(ftruncate(fd, 4096) == 0);  // pages 1.. are gone

    SECTION("RDMA write from the peer: IBV_WC_REM_ACCESS_ERR") {
        RcPair p(dev, peer);
        Buffer other(peer.pd, 8192, kAll);
        ibv_send_wr w{};
        w.opcode = IBV_WR_RDMA_WRITE;
        w.send_flags = IBV_SEND_SIGNALED;
        w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(m + 2 * 4096);
        w.wr.rdma.rkey = mr->rkey;
        REQUIRE(post_send(p.b.qp, w, {sge(other, 0, 8192)}) == 0);
        CHECK(complete(p.b.send_cq) == IBV_WC_REM_ACCESS_ERR);
        w.opcode = IBV_WR_RDMA_READ;
        RcPair q(dev, peer);
        REQUIRE(post_send(q.b.qp, w, {sge(other, 0, 8192)}) == 0);
        CHECK(complete(q.b.send_cq) == IBV_WC_REM_ACCESS_ERR);
    }
    SECTION("send out of it: IBV_WC_LOC_PROT_ERR") {
        RcPair p(dev, peer);
        Buffer other(peer.pd, 8192, kAll);
        REQUIRE(post_recv(p.b.qp, 1, {sge(other, 0, 8192)}) == 0);
        ibv_send_wr wr{};
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        REQUIRE(post_send(p.a.qp, wr, {mr_sge(mr, m + 4096, 8192)}) == 0);
        CHECK(complete(p.a.send_cq) == IBV_WC_LOC_PROT_ERR);
    }
    SECTION("a hole punched in it reads as zeros, as in the guest") {
        REQUIRE(ftruncate(fd, off_t(len)) == 0);
        std::memset(m, 0xab, len);
        REQUIRE(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0);
        RcPair p(dev, peer);
        Buffer other(peer.pd, 8192, kAll);
        ibv_send_wr w{};
        w.opcode = IBV_WR_RDMA_READ;
        w.send_flags = IBV_SEND_SIGNALED;
        w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(m);
        w.wr.rdma.rkey = mr->rkey;
        REQUIRE(post_send(p.b.qp, w, {sge(other, 0, 8192)}) == 0);
        CHECK(complete(p.b.send_cq) == IBV_WC_SUCCESS);
        CHECK(other.data[0] == 0);
        CHECK(other.data[4096] == 0xab);
    }
    // The pages that remain, and everything else, keep working.
    exercise(dev, peer, m, 4096, "the page that remains");
    std::vector<uint8_t> fresh(kLen);
    exercise(dev, peer, fresh.data(), kLen, "other memory");
    ibv_dereg_mr(mr);
    munmap(m, len);
    close(fd);
}

TEST_CASE("memory unmapped or replaced under a live MR: the MR keeps its pages, as a device's pinned pages",
          "[memory]") {
    // A device pins an MR's pages: what the process maps there afterwards
    // is not what the device reads or writes. vrdma's MR holds the object it
    // registered in the same way; the shim neither crashes nor reaches the
    // new mapping, and the peer's transfers keep their meaning.
    Device dev, peer(Device::kPeer);
    const size_t len = 3 * 4096;
    auto* m = static_cast<uint8_t*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    REQUIRE(m != MAP_FAILED);
    pattern(m, len, 5);
    ibv_mr* mr = ibv_reg_mr(dev.pd, m, len, kAll);
    REQUIRE(mr != nullptr);
    // The middle page replaced by a new private page, the last one unmapped.
    REQUIRE(mmap(m + 4096, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED);
    std::memset(m + 4096, 0xee, 4096);
    REQUIRE(munmap(m + 2 * 4096, 4096) == 0);

    RcPair p(dev, peer);
    Buffer other(peer.pd, len, kAll);
    CHECK(peer_rdma(p, IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(m), mr->rkey, other, len) == IBV_WC_SUCCESS);
    CHECK(has_pattern(other.data, len, 5));  // the registered pages, not the new one
    // A write lands in the registered pages; the new page stays as it was.
    pattern(other.data, len, 6);
    CHECK(peer_rdma(p, IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(m), mr->rkey, other, len) == IBV_WC_SUCCESS);
    CHECK(m[4096] == 0xee);
    CHECK(m[2 * 4096 - 1] == 0xee);
    CHECK(has_pattern(m, 4096, 6));  // the first page is still the registered one
    CHECK(ibv_dereg_mr(mr) == 0);
    munmap(m, 2 * 4096);
    // And everything keeps working.
    std::vector<uint8_t> fresh(kLen);
    exercise(dev, peer, fresh.data(), kLen, "other memory");
}

TEST_CASE("fork after ibv_reg_mr: the child gets a private copy, the parent's MR keeps working", "[memory][fork]") {
    Device dev, peer(Device::kPeer);
    std::vector<uint8_t> heap(kLen);
    ibv_mr* mr = ibv_reg_mr(dev.pd, heap.data(), kLen, kAll);
    REQUIRE(mr != nullptr);
    pattern(heap.data(), kLen, 5);
    pattern(g_bss, 4096, 6);
    ibv_mr* bss_mr = ibv_reg_mr(dev.pd, g_bss, 4096, kAll);
    REQUIRE(bss_mr != nullptr);
    // Private hugetlb pages too, where there are some (moved onto a hugetlb
    // memfd: the child gets ordinary private pages with their contents).
    uint8_t* huge = nullptr;
    ibv_mr* huge_mr = nullptr;
    if (free_huge_pages() >= 4) {
        void* h = mmap(nullptr, kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        REQUIRE(h != MAP_FAILED);
        huge = static_cast<uint8_t*>(h);
        pattern(huge, 8192, 7);
        huge_mr = ibv_reg_mr(dev.pd, huge, 8192, kAll);
        REQUIRE(huge_mr != nullptr);
    }
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    pid_t child = fork();
    if (child == 0) {
        // The child sees the parent's data, then scribbles over its copy
        // and allocates (its heap is its own), then exits.
        bool saw = has_pattern(heap.data(), kLen, 5) && has_pattern(g_bss, 4096, 6) &&
                   (!huge || has_pattern(huge, 8192, 7));
        std::memset(heap.data(), 0xee, kLen);
        std::memset(g_bss, 0xee, 4096);
        if (huge) std::memset(huge, 0xee, 8192);
        std::vector<uint8_t> more(1 << 16, 1);
        char c = saw && more[100] == 1 ? 'y' : 'n';
        (void)!write(ready[1], &c, 1);
        _exit(0);
    }
    REQUIRE(child > 0);
    char c = 0;
    REQUIRE(read(ready[0], &c, 1) == 1);
    int status = -1;
    REQUIRE(waitpid(child, &status, 0) == child);
    close(ready[0]);
    close(ready[1]);
    CHECK(c == 'y');
    CHECK(status == 0);
    // The parent's memory is untouched and its registration still moves data.
    CHECK(has_pattern(heap.data(), kLen, 5));
    CHECK(has_pattern(g_bss, 4096, 6));
    if (huge) {
        CHECK(has_pattern(huge, 8192, 7));
        CHECK(ibv_dereg_mr(huge_mr) == 0);
        munmap(huge, kHuge);
    }
    CHECK(ibv_dereg_mr(mr) == 0);
    CHECK(ibv_dereg_mr(bss_mr) == 0);
    exercise(dev, peer, heap.data(), kLen, "heap registered before the fork");
}
