// The shim against hostile guests: memfds it must refuse, per-guest quotas,
// guest fds that try to block it.
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <vector>

#include "fault_guard.h"
#include "guest_fd.h"
#include "quota.h"
#include "segment_table.h"
#include "shim_harness.h"
#include "work_queue.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;

namespace {

UniqueFd memfd(size_t len, bool allow_sealing, bool seal) {
    int fd = memfd_create("hard", MFD_CLOEXEC | (allow_sealing ? MFD_ALLOW_SEALING : 0));
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, off_t(len)) == 0);
    if (seal) REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
    return UniqueFd(fd);
}

}  // namespace

TEST_CASE("only sealed memfds may hold rings; other files back MRs only", "[shim][hardening]") {
    std::shared_ptr<Mapping> map;
    std::string why;
    // Ring memory (the attach arena): a memfd sealed against shrinking.
    CHECK(map_segment(memfd(8192, false, false), 0x100000, 8192, 0, map, nullptr, &why, true) == EPERM);
    CHECK(why.find("F_SEAL_SHRINK") != std::string::npos);
    CHECK(map_segment(memfd(8192, true, false), 0x100000, 8192, 0, map, nullptr, nullptr, true) == EPERM);
    CHECK(map_segment(memfd(8192, true, true), 0x100000, 8192, 0, map, nullptr, nullptr, true) == 0);
    CHECK(map->ring_safe);
    // MR memory: an unsealed memfd is mapped, but not for rings.
    REQUIRE(map_segment(memfd(8192, true, false), 0x100000, 8192, 0, map) == 0);
    CHECK_FALSE(map->ring_safe);
    SegmentTable t;
    REQUIRE(t.insert(1, map) == 0);
    HostRange r;
    CHECK(t.translate_ring(0x100000, 64, r) == EFAULT);
    CHECK(t.translate_one(0x100000, 64, r) == 0);
    // Smaller than announced.
    why.clear();
    CHECK(map_segment(memfd(4096, true, true), 0x100000, 8192, 0, map, nullptr, &why) == EINVAL);
    CHECK(why.find("smaller") != std::string::npos);
    // A regular file on another file system backs MRs, never rings.
    char path[] = "/tmp/vrdma-hard-XXXXXX";
    int f = mkstemp(path);
    REQUIRE(f >= 0);
    unlink(path);
    REQUIRE(ftruncate(f, 8192) == 0);
    int f2 = dup(f);
    CHECK(map_segment(UniqueFd(f), 0x100000, 8192, 0, map, nullptr, nullptr, true) == EINVAL);
    REQUIRE(map_segment(UniqueFd(f2), 0x100000, 8192, 0, map) == 0);
    CHECK_FALSE(map->ring_safe);
}

TEST_CASE("a copy from a truncated guest file fails instead of killing the shim", "[shim][hardening]") {
    install_fault_guard();
    UniqueFd fd = memfd(3 * 4096, true, false);
    int raw = fd.get();
    std::shared_ptr<Mapping> map;
    REQUIRE(map_segment(std::move(fd), 0x100000, 3 * 4096, 0, map) == 0);
    std::vector<uint8_t> local(8192, 7);
    Span dst{map->base + 4096, 8192}, src{local.data(), 8192};
    CHECK(copy_sg(&dst, 1, 0, &src, 1, 8192) == CopyFault::None);
    REQUIRE(ftruncate(raw, 4096) == 0);
    CHECK(copy_sg(&dst, 1, 0, &src, 1, 8192) == CopyFault::Dst);
    CHECK(copy_sg(&src, 1, 0, &dst, 1, 8192) == CopyFault::Src);
    uint64_t old = 0;
    CHECK_FALSE(guarded_fetch_add(reinterpret_cast<uint64_t*>(map->base + 8192), 1, &old));
    CHECK_FALSE(guarded_compare_swap(reinterpret_cast<uint64_t*>(map->base + 8192), 0, 1, &old));
    CHECK_FALSE(guarded_atomic_store(reinterpret_cast<uint64_t*>(map->base + 8192), 1));
    CHECK(guarded_atomic_store(reinterpret_cast<uint64_t*>(map->base + 8), 3));
    CHECK(guarded_fetch_add(reinterpret_cast<uint64_t*>(map->base), 5, &old));
    CHECK(guarded_compare_swap(reinterpret_cast<uint64_t*>(map->base), 5, 9, &old));
    CHECK(old == 5);
}

TEST_CASE("the attach arena must be sealed", "[shim][hardening]") {
    Engine eng;
    const GuestIdentity& g = eng.add_guest("a", 1, 1);
    void* p = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    int err = 0;
    std::string why;
    uint64_t gva = reinterpret_cast<uint64_t>(p);
    CHECK(!eng.attach(g, memfd(1 << 20, true, false), gva, 1 << 20, UniqueFd(), UniqueFd(), UniqueFd(), err, &why));
    CHECK(err == EPERM);
    CHECK(eng.context_count() == 0);
    CHECK(eng.attach(g, memfd(1 << 20, true, true), gva, 1 << 20, UniqueFd(), UniqueFd(), UniqueFd(), err));
    munmap(p, 1 << 20);
}

TEST_CASE("quotas are per guest, across its contexts, and come back", "[shim][hardening][quota]") {
    Quotas q;
    q.max_qp = 2;
    q.max_pd = 3;
    q.max_mr = 2;
    q.max_mr_bytes = 3 * 4096;
    Engine eng(q);
    eng.set_clock(fake_clock);
    const GuestIdentity& ga = eng.add_guest("a", 1, 0x1111);
    const GuestIdentity& gb = eng.add_guest("b", 2, 0x2222);
    GuestUsage* ua = eng.guests().usage_of(ga);
    REQUIRE(ua);
    {
        FakeProvider a1(eng, ga), a2(eng, ga), b(eng, gb);
        CHECK(ua->used(Res::Mappings) == 2);  // two arenas
        uint32_t pd1 = a1.pd(), pd2 = a2.pd();
        a1.pd();
        CHECK(a2.cmd(abi::CmdOp::AllocPd).status == ENOMEM);  // 3 PDs across a1 and a2
        CHECK(ua->refusals() == 1);
        b.pd();  // guest b has its own quota

        auto cq1 = a1.cq(16);
        auto cq2 = a2.cq(16);
        a1.qp(pd1, cq1, cq1);
        auto q2 = a2.qp(pd2, cq2, cq2);
        FakeProvider::QpView v;
        auto req = a2.qp_req(pd2, cq2, cq2, QpSpec{}, v);
        CHECK(a2.cmd(abi::CmdOp::CreateQp, req).status == ENOMEM);
        CHECK(ua->used(Res::Qp) == 2);
        CHECK(ua->used(Res::Wr) == 2 * (16 + 16));
        REQUIRE(a2.cmd(abi::CmdOp::DestroyQp, abi::CmdHandleReq{q2.handle}).status == 0);
        CHECK(ua->used(Res::Qp) == 1);
        CHECK(ua->used(Res::Wr) == 32);
        CHECK(a2.cmd(abi::CmdOp::CreateQp, req).status == 0);

        // Registered memory: 3 pages in all.
        uint64_t buf = a1.alloc(4 * 4096, 4096);
        CHECK(a1.cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd1, IBV_ACCESS_LOCAL_WRITE, buf, 4 * 4096, buf}).status ==
              ENOMEM);
        auto m = a1.cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd1, IBV_ACCESS_LOCAL_WRITE, buf, 2 * 4096, buf});
        REQUIRE(m.status == 0);
        CHECK(a2.cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd2, 0, buf, 2 * 4096, buf}).status == ENOMEM);
        CHECK(ua->used(Res::MrBytes) == 2 * 4096);
        uint32_t mh = m.as<abi::CmdRegMrResp>().mr_handle;
        REQUIRE(a1.cmd(abi::CmdOp::DeregMr, abi::CmdHandleReq{mh}).status == 0);
        CHECK(ua->used(Res::MrBytes) == 0);
        CHECK(a1.cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd1, IBV_ACCESS_LOCAL_WRITE, buf, 3 * 4096, buf}).status == 0);

        // A context that dies gives back everything it held.
        eng.detach(a1.ctx_id());
        CHECK(ua->used(Res::Qp) == 1);
        CHECK(ua->used(Res::Pd) == 1);
        CHECK(ua->used(Res::MrBytes) == 0);
        CHECK(ua->used(Res::Mappings) == 1);
        eng.detach(a2.ctx_id());
        eng.detach(b.ctx_id());
    }
    for (unsigned i = 0; i < kResCount; ++i) {
        CHECK(ua->used(Res(i)) == 0);
        CHECK(eng.guests().usage_of(gb)->used(Res(i)) == 0);
    }
    CHECK(eng.global_usage().mappings == 0);
}

TEST_CASE("an MR over several segments is charged mappings", "[shim][hardening][quota]") {
    Quotas q;
    q.max_mappings = 4;
    Engine eng(q);
    const GuestIdentity& ga = eng.add_guest("a", 1, 0x1111);
    FakeProvider a(eng, ga);
    GuestUsage* ua = eng.guests().usage_of(ga);
    // Three adjacent one-page segments at a fresh address range.
    void* area = mmap(nullptr, 3 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(area != MAP_FAILED);
    const uint64_t base = reinterpret_cast<uint64_t>(area);
    for (uint32_t i = 0; i < 3; ++i) {
        std::shared_ptr<Mapping> m;
        REQUIRE(map_segment(memfd(4096, true, true), base + i * 4096, 4096, 0, m, ua) == 0);
        REQUIRE(a.ctx().segments.insert(10 + i, std::move(m)) == 0);
    }
    CHECK(ua->used(Res::Mappings) == 4);  // arena + 3 segments
    uint32_t pd = a.pd();
    // Composing them would need 1 + 3 more mappings.
    CHECK(a.cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd, 0, base, 3 * 4096, base}).status == ENOMEM);
    // Inside one segment it costs nothing.
    CHECK(a.cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd, 0, base + 4096, 4096, base + 4096}).status == 0);
    CHECK(ua->used(Res::Mappings) == 4);
    munmap(area, 3 * 4096);
}

TEST_CASE("set_quota parses keys and sizes", "[shim][hardening][quota]") {
    Quotas q;
    std::string err;
    CHECK(set_quota(q, "qp=10", err));
    CHECK(q.max_qp == 10);
    CHECK(set_quota(q, "mr_bytes=4G", err));
    CHECK(q.max_mr_bytes == 4ull << 30);
    CHECK(set_quota(q, "mappings=0x100", err));
    CHECK(q.max_mappings == 256);
    CHECK(!set_quota(q, "bogus=1", err));
    CHECK(!set_quota(q, "qp", err));
    CHECK(!set_quota(q, "qp=-1", err));
    CHECK(!set_quota(q, "qp=8G", err));  // over 2^32
    CHECK(!set_quota(q, "mr_bytes=1X", err));
}

TEST_CASE("guest fds cannot block the shim", "[shim][hardening]") {
    // A blocking eventfd whose counter the guest saturated: a plain write
    // would block for ever.
    int efd = eventfd(0, EFD_CLOEXEC);
    REQUIRE(efd >= 0);
    uint64_t big = 0xfffffffffffffffeull;
    REQUIRE(write(efd, &big, 8) == 8);
    auto t0 = std::chrono::steady_clock::now();
    uint64_t one = 1;
    CHECK(guest_fd_write(efd, &one, 8) < 0);
    // An empty blocking eventfd read.
    uint64_t v;
    REQUIRE(read(efd, &v, 8) == 8);
    CHECK(guest_fd_read(efd, &v, 8) < 0);
    // A full blocking pipe.
    int p[2];
    REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    char junk[4096] = {};
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    while (write(p[1], junk, sizeof(junk)) > 0) {
    }
    fcntl(p[1], F_SETFL, 0);  // the guest clears O_NONBLOCK
    CHECK(guest_fd_write(p[1], junk, 16) < 0);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    close(p[0]);
    close(p[1]);
    close(efd);
}

TEST_CASE("a guest fd that blocked the shim detaches its context", "[shim][hardening]") {
    // The guard timer interrupted the call (EINTR): the guest had cleared
    // O_NONBLOCK. Any other failure (EAGAIN: pipe full) is the guest's loss.
    TwoGuests t;
    errno = EAGAIN;
    t.a.ctx().check_blocked(-1, "test fd");
    CHECK(!t.a.ctx().dead);
    errno = EINTR;
    t.a.ctx().check_blocked(8, "test fd");
    CHECK(!t.a.ctx().dead);
    t.a.ctx().check_blocked(-1, "test fd");
    CHECK(t.a.ctx().dead);
    CHECK(!t.b.ctx().dead);
    auto dead = t.eng.dead_contexts();
    REQUIRE(dead.size() == 1);
    CHECK(dead[0] == t.a.ctx_id());
}
