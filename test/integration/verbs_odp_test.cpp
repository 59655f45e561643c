// On-demand paging (issue 30; docs/protocol.md "On-demand paging"):
// IBV_ACCESS_ON_DEMAND, explicit and implicit, faults taken when a work
// request names memory not shared yet, ibv_advise_mr, and what happens to
// memory never named or not mapped.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "verbs_fixture.h"

using namespace vt;

namespace {

constexpr int kOdp = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ON_DEMAND;
constexpr size_t kPage = 4096;

// Through a device (test-hca's run), an ODP MR serves this host and TCP
// only (docs/protocol.md): the device never has it.
bool odp_reaches_peer() {
    if (!through_rxe()) return true;
    WARN("ODP across the HCA transport is not offered: the on-demand cases are not run through rxe");
    return false;
}

ibv_mr* implicit_mr(Device& d) { return ibv_reg_mr(d.pd, nullptr, SIZE_MAX, kOdp); }

// Fresh anonymous memory, private, never named to the device.
uint8_t* fresh(size_t len) {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    return static_cast<uint8_t*>(p);
}

uint32_t send_from(RcPair& p, ibv_sge s) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    REQUIRE(post_send(p.a.qp, wr, {s}) == 0);
    return complete(p.a.send_cq);
}

}  // namespace

TEST_CASE("the device reports on-demand paging, the implicit MR included", "[odp]") {
    Device d;
    ibv_device_attr_ex attr{};
    REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &attr) == 0);
    CHECK((attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0);
    CHECK((attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) != 0);
    const uint32_t rc = attr.odp_caps.per_transport_caps.rc_odp_caps;
    for (uint32_t cap : {IBV_ODP_SUPPORT_SEND, IBV_ODP_SUPPORT_RECV, IBV_ODP_SUPPORT_WRITE, IBV_ODP_SUPPORT_READ,
                         IBV_ODP_SUPPORT_ATOMIC, IBV_ODP_SUPPORT_SRQ_RECV})
        CHECK((rc & cap) == cap);
    CHECK((attr.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND) != 0);
}

TEST_CASE("an implicit ODP MR: sends and receives out of memory never registered; the peer reaches what was "
          "named or prefetched, and nothing else",
          "[odp]") {
    Device dev, peer(Device::kPeer);
    if (!odp_reaches_peer()) return;
    ibv_mr* mr = implicit_mr(dev);
    REQUIRE(mr != nullptr);
    CHECK(mr->addr == nullptr);
    CHECK(mr->length == SIZE_MAX);
    // Without IBV_ACCESS_ON_DEMAND the whole address space is refused.
    CHECK(ibv_reg_mr(dev.pd, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE) == nullptr);

    RcPair p(dev, peer);
    Buffer other(peer.pd, 4 * kPage, kOdp & ~IBV_ACCESS_ON_DEMAND);
    constexpr size_t kLen = 3 * kPage;
    uint8_t* mem = fresh(4 << 20);

    // A send out of memory first named by this work request: the post
    // takes the fault.
    pattern(mem + 100, kLen, 1);
    REQUIRE(post_recv(p.b.qp, 1, {sge(other, 0, kLen)}) == 0);
    CHECK(send_from(p, ibv_sge{reinterpret_cast<uint64_t>(mem + 100), kLen, mr->lkey}) == IBV_WC_SUCCESS);
    CHECK(complete(p.b.recv_cq) == IBV_WC_SUCCESS);
    CHECK(has_pattern(other.data, kLen, 1));

    // A receive into the heap.
    std::vector<uint8_t> heap(kLen);
    REQUIRE(post_recv(p.a.qp, 2, {ibv_sge{reinterpret_cast<uint64_t>(heap.data()), kLen, mr->lkey}}) == 0);
    pattern(other.data, kLen, 2);
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    REQUIRE(post_send(p.b.qp, wr, {sge(other, 0, kLen)}) == 0);
    CHECK(complete(p.b.send_cq) == IBV_WC_SUCCESS);
    CHECK(complete(p.a.recv_cq) == IBV_WC_SUCCESS);
    CHECK(has_pattern(heap.data(), kLen, 2));

    // The peer reads what a work request named, and writes what
    // ibv_advise_mr prefetched.
    CHECK(peer_rdma(p, IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(mem + 100), mr->rkey, other, kLen) ==
          IBV_WC_SUCCESS);
    CHECK(has_pattern(other.data, kLen, 1));
    uint8_t* far = mem + (3 << 20);
    ibv_sge pre{reinterpret_cast<uint64_t>(far), uint32_t(kPage), mr->lkey};
    CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &pre, 1) == 0);
    pattern(other.data, kPage, 3);
    CHECK(peer_rdma(p, IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(far), mr->rkey, other, kPage) ==
          IBV_WC_SUCCESS);
    CHECK(has_pattern(far, kPage, 3));

    // Memory nobody named: the peer gets a remote access error (vrdma takes
    // no fault for a remote request; docs/protocol.md).
    uint8_t* untouched = fresh(kPage);
    CHECK(peer_rdma(p, IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(untouched), mr->rkey, other, 64) ==
          IBV_WC_REM_ACCESS_ERR);

    // A local work request naming memory not mapped: the post succeeds and
    // its completion is a protection error, as a device's would be.
    RcPair q(dev, peer);
    uint8_t* gone = fresh(kPage);
    REQUIRE(munmap(gone, kPage) == 0);
    CHECK(send_from(q, ibv_sge{reinterpret_cast<uint64_t>(gone), 64, mr->lkey}) == IBV_WC_LOC_PROT_ERR);

    CHECK(ibv_dereg_mr(mr) == 0);
    munmap(untouched, kPage);
    munmap(mem, 4 << 20);
}

TEST_CASE("an implicit ODP MR: a range that two faults shared in two pieces moves whole", "[odp]") {
    Device dev, peer(Device::kPeer);
    if (!odp_reaches_peer()) return;
    ibv_mr* mr = implicit_mr(dev);
    REQUIRE(mr != nullptr);
    RcPair p(dev, peer);
    Buffer other(peer.pd, 4 * kPage, kOdp & ~IBV_ACCESS_ON_DEMAND);
    constexpr size_t kMap = 8 << 20, kWindow = 2 << 20;
    uint8_t* mem = fresh(kMap);
    // A 2 MiB boundary inside the mapping, at least two pages in (the first
    // one past mem + 2 pages: the mapping may start just below a boundary):
    // a fault shares the window on one side of it, and a range across it
    // then needs the window on the other.
    uint8_t* edge = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mem) + 2 * kPage + kWindow - 1) &
                                               ~uintptr_t(kWindow - 1));
    pattern(edge - 2 * kPage, 4 * kPage, 7);
    REQUIRE(post_recv(p.b.qp, 1, {sge(other, 0, kPage)}) == 0);
    CHECK(send_from(p, ibv_sge{reinterpret_cast<uint64_t>(edge - kPage), uint32_t(kPage), mr->lkey}) ==
          IBV_WC_SUCCESS);
    CHECK(complete(p.b.recv_cq) == IBV_WC_SUCCESS);
    for (int i = 0; i < 3; ++i) {  // the second and third find it shared
        std::memset(other.data, 0, 4 * kPage);
        REQUIRE(post_recv(p.b.qp, 2, {sge(other, 0, 2 * kPage)}) == 0);
        CHECK(send_from(p, ibv_sge{reinterpret_cast<uint64_t>(edge - kPage), uint32_t(2 * kPage), mr->lkey}) ==
              IBV_WC_SUCCESS);
        CHECK(complete(p.b.recv_cq) == IBV_WC_SUCCESS);
        CHECK(std::memcmp(other.data, edge - kPage, 2 * kPage) == 0);
    }
    // The peer reads across the boundary by the MR's rkey.
    std::memset(other.data, 0, 4 * kPage);
    CHECK(peer_rdma(p, IBV_WR_RDMA_READ, reinterpret_cast<uint64_t>(edge - 1000), mr->rkey, other, 2000) ==
          IBV_WC_SUCCESS);
    CHECK(std::memcmp(other.data, edge - 1000, 2000) == 0);
    CHECK(ibv_dereg_mr(mr) == 0);
    munmap(mem, kMap);
}

TEST_CASE("an explicit ODP MR over a range with a hole: registered, and the hole works once mapped", "[odp]") {
    Device dev, peer(Device::kPeer);
    if (!odp_reaches_peer()) return;
    uint8_t* mem = fresh(3 * kPage);
    REQUIRE(munmap(mem + kPage, kPage) == 0);
    // Pinned registration needs every page; ODP does not.
    errno = 0;
    CHECK(ibv_reg_mr(dev.pd, mem, 3 * kPage, kOdp & ~IBV_ACCESS_ON_DEMAND) == nullptr);
    CHECK(errno == EFAULT);
    ibv_mr* mr = ibv_reg_mr(dev.pd, mem, 3 * kPage, kOdp);
    REQUIRE(mr != nullptr);
    void* again = mmap(mem + kPage, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    REQUIRE(again == mem + kPage);
    RcPair p(dev, peer);
    Buffer other(peer.pd, 3 * kPage, kOdp & ~IBV_ACCESS_ON_DEMAND);
    pattern(mem, 3 * kPage, 4);
    REQUIRE(post_recv(p.b.qp, 1, {sge(other, 0, 3 * kPage)}) == 0);
    CHECK(send_from(p, ibv_sge{reinterpret_cast<uint64_t>(mem), uint32_t(3 * kPage), mr->lkey}) == IBV_WC_SUCCESS);
    CHECK(complete(p.b.recv_cq) == IBV_WC_SUCCESS);
    CHECK(has_pattern(other.data, 3 * kPage, 4));
    // Outside the MR: a protection error, even with the memory there.
    RcPair q(dev, peer);
    CHECK(send_from(q, ibv_sge{reinterpret_cast<uint64_t>(mem + 2 * kPage), uint32_t(2 * kPage), mr->lkey}) ==
          IBV_WC_LOC_PROT_ERR);
    CHECK(ibv_dereg_mr(mr) == 0);
    munmap(mem, 3 * kPage);
}

TEST_CASE("ibv_advise_mr: prefetches ODP MRs and refuses what the verbs refuse", "[odp]") {
    Device dev;
    ibv_mr* odp = implicit_mr(dev);
    REQUIRE(odp != nullptr);
    Buffer pinned(dev.pd, kPage, IBV_ACCESS_LOCAL_WRITE);
    uint8_t* mem = fresh(kPage);
    ibv_sge s{reinterpret_cast<uint64_t>(mem), 64, odp->lkey};
    CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &s, 1) == 0);
    CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &s, 1) == 0);
    CHECK(ibv_advise_mr(dev.pd, static_cast<ibv_advise_mr_advice>(7), 0, &s, 1) == EOPNOTSUPP);
    CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &s, 1) == EINVAL);
    CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &s, 0) == EINVAL);
    // An MR that is not ODP.
    ibv_sge p = sge(pinned, 0, 64);
    CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &p, 1) == EINVAL);
    // Memory not mapped: a prefetch fails, one that must not fault does not.
    uint8_t* gone = fresh(kPage);
    REQUIRE(munmap(gone, kPage) == 0);
    ibv_sge g{reinterpret_cast<uint64_t>(gone), 64, odp->lkey};
    CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &g, 1) == EFAULT);
    CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &g, 1) == 0);
    // An ODP MR stays as registered.
    CHECK(ibv_rereg_mr(odp, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE) != 0);
    CHECK(ibv_dereg_mr(odp) == 0);
    munmap(mem, kPage);
}
