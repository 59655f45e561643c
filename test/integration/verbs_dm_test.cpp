// Device memory and MRs named by another address (issue 30; docs/
// protocol.md "Device memory"): ibv_alloc_dm within max_dm_size and its
// refusals, ibv_memcpy_to_dm and ibv_memcpy_from_dm with their bounds,
// zero-based MRs over it (ibv_reg_dm_mr) that the peer guest writes and
// reads by RDMA and that sends and receives go through, and ibv_reg_mr_iova.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <vector>

#include "verbs_fixture.h"

using namespace vt;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

uint64_t max_dm_size(Device& d) {
    ibv_device_attr_ex attr{};
    REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &attr) == 0);
    return attr.max_dm_size;
}

ibv_dm* alloc(Device& d, uint64_t len, uint32_t comp_mask = 0) {
    ibv_alloc_dm_attr a{};
    a.length = len;
    a.comp_mask = comp_mask;
    return ibv_alloc_dm(d.ctx, &a);
}

}  // namespace

TEST_CASE("ibv_alloc_dm gives what max_dm_size says, and refuses more", "[dm]") {
    Device d;
    const uint64_t max = max_dm_size(d);
    REQUIRE(max == 1u << 20);
    errno = 0;
    CHECK(alloc(d, max + 1) == nullptr);
    CHECK(errno == ENOMEM);
    errno = 0;
    CHECK(alloc(d, 4096, 1) == nullptr);  // an unknown comp_mask
    CHECK(errno == EINVAL);
    CHECK(alloc(d, 0) == nullptr);
    // The whole of it, in two halves: a third allocation finds none left
    // until one of them is freed.
    ibv_dm* h1 = alloc(d, max / 2);
    ibv_dm* h2 = alloc(d, max / 2);
    REQUIRE(h1 != nullptr);
    REQUIRE(h2 != nullptr);
    errno = 0;
    CHECK(alloc(d, 4) == nullptr);
    CHECK(errno == ENOMEM);
    CHECK(ibv_free_dm(h1) == 0);
    ibv_dm* h3 = alloc(d, 4);
    CHECK(h3 != nullptr);
    CHECK(ibv_free_dm(h2) == 0);
    if (h3) CHECK(ibv_free_dm(h3) == 0);
}

TEST_CASE("ibv_memcpy_to_dm and ibv_memcpy_from_dm move data, and refuse copies out of bounds or unaligned",
          "[dm]") {
    Device d;
    constexpr size_t kDm = 10000;
    ibv_dm* dm = alloc(d, kDm);
    REQUIRE(dm != nullptr);
    std::vector<uint8_t> in(kDm), out(kDm);
    pattern(in.data(), kDm, 5);
    REQUIRE(ibv_memcpy_to_dm(dm, 0, in.data(), kDm) == 0);
    REQUIRE(ibv_memcpy_from_dm(out.data(), dm, 0, kDm) == 0);
    CHECK(has_pattern(out.data(), kDm, 5));
    std::vector<uint8_t> part(400);
    REQUIRE(ibv_memcpy_from_dm(part.data(), dm, 4000, 400) == 0);
    CHECK(std::memcmp(part.data(), in.data() + 4000, 400) == 0);
    CHECK(ibv_memcpy_to_dm(dm, 2, in.data(), 4) == EINVAL);          // unaligned offset
    CHECK(ibv_memcpy_to_dm(dm, 4, in.data(), 6) == EINVAL);          // unaligned length
    CHECK(ibv_memcpy_to_dm(dm, kDm + 4, in.data(), 4) == EINVAL);    // past the end
    CHECK(ibv_memcpy_from_dm(out.data(), dm, 0, kDm + 4) == EINVAL);  // longer than it
    CHECK(ibv_free_dm(dm) == 0);
}

TEST_CASE("a zero-based MR over device memory: the peer writes and reads it by RDMA, sends go through it",
          "[dm]") {
    Device dev, peer(Device::kPeer);
    // Through a device (test-hca's run) the MR must start on a page: a
    // device takes an iova only with the memory's offset in its page, and
    // a zero-based MR's iova is 0 (docs/protocol.md "Device memory").
    const size_t kOff = through_rxe() ? 4096 : 1024;
    constexpr size_t kDm = 4 * 4096, kLen = 2 * 4096 + 100;
    ibv_dm* dm = alloc(dev, kDm);
    REQUIRE(dm != nullptr);
    // Outside the allocation, or without IBV_ACCESS_ZERO_BASED: refused.
    CHECK(ibv_reg_dm_mr(dev.pd, dm, kOff, kDm, kAll | IBV_ACCESS_ZERO_BASED) == nullptr);
    CHECK(ibv_reg_dm_mr(dev.pd, dm, 0, kDm, kAll) == nullptr);
    // A zero-length MR is allowed, as on mlx5 (rdma-core's suite makes one).
    ibv_mr* empty = ibv_reg_dm_mr(dev.pd, dm, 0, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED);
    CHECK(empty != nullptr);
    if (empty) CHECK(ibv_dereg_mr(empty) == 0);

    ibv_mr* mr = ibv_reg_dm_mr(dev.pd, dm, kOff, kLen, kAll | IBV_ACCESS_ZERO_BASED);
    REQUIRE(mr != nullptr);
    CHECK(ibv_free_dm(dm) == EBUSY);  // an MR is over it
    RcPair p(dev, peer);
    Buffer other(peer.pd, kLen, kAll);
    std::vector<uint8_t> seen(kLen);

    // The peer writes it: work requests name its bytes from 0.
    pattern(other.data, kLen, 1);
    CHECK(peer_rdma(p, IBV_WR_RDMA_WRITE, 0, mr->rkey, other, kLen) == IBV_WC_SUCCESS);
    REQUIRE(ibv_memcpy_from_dm(seen.data(), dm, kOff, kLen & ~size_t(3)) == 0);
    CHECK(has_pattern(seen.data(), kLen & ~size_t(3), 1));

    // ... and reads it, from an offset inside the MR.
    pattern(seen.data(), kLen, 2);
    REQUIRE(ibv_memcpy_to_dm(dm, kOff, seen.data(), kLen & ~size_t(3)) == 0);
    std::memset(other.data, 0, kLen);
    CHECK(peer_rdma(p, IBV_WR_RDMA_READ, 4096, mr->rkey, other, 4096) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(other.data, seen.data() + 4096, 4096) == 0);

    // Beyond the MR's length: a remote access error, as for any MR.
    CHECK(peer_rdma(p, IBV_WR_RDMA_WRITE, kLen - 10, mr->rkey, other, 64) == IBV_WC_REM_ACCESS_ERR);
    RcPair q(dev, peer);

    // A send out of it, and a receive into it, through local SGEs from 0.
    REQUIRE(post_recv(q.b.qp, 1, {sge(other, 0, 4096)}) == 0);
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    REQUIRE(post_send(q.a.qp, wr, {ibv_sge{0, 4096, mr->lkey}}) == 0);
    CHECK(complete(q.a.send_cq) == IBV_WC_SUCCESS);
    CHECK(complete(q.b.recv_cq) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(other.data, seen.data(), 4096) == 0);
    pattern(other.data, 4096, 3);
    REQUIRE(post_recv(q.a.qp, 2, {ibv_sge{8, 4096, mr->lkey}}) == 0);
    REQUIRE(post_send(q.b.qp, wr, {sge(other, 0, 4096)}) == 0);
    CHECK(complete(q.b.send_cq) == IBV_WC_SUCCESS);
    CHECK(complete(q.a.recv_cq) == IBV_WC_SUCCESS);
    REQUIRE(ibv_memcpy_from_dm(seen.data(), dm, kOff + 8, 4096) == 0);
    CHECK(has_pattern(seen.data(), 4096, 3));

    CHECK(ibv_dereg_mr(mr) == 0);
    CHECK(ibv_free_dm(dm) == 0);
}

TEST_CASE("ibv_reg_mr_iova: work requests name the memory by the iova given", "[dm]") {
    Device dev, peer(Device::kPeer);
    constexpr size_t kLen = 2 * 4096;
    std::vector<uint8_t> store(kLen + 4096);
    uint8_t* mem = store.data() + (4096 - reinterpret_cast<uintptr_t>(store.data()) % 4096) % 4096 + 100;
    const uint64_t iova = 0x7000'0000'0000ull + 100;  // the same offset in its page
    // The kernel's rule: an iova whose offset in its page differs is refused.
    CHECK(ibv_reg_mr_iova(dev.pd, mem, kLen - 100, iova + 1, kAll) == nullptr);
    ibv_mr* mr = ibv_reg_mr_iova(dev.pd, mem, kLen - 100, iova, kAll);
    REQUIRE(mr != nullptr);
    RcPair p(dev, peer);
    Buffer other(peer.pd, kLen, kAll);
    pattern(other.data, 1000, 9);
    CHECK(peer_rdma(p, IBV_WR_RDMA_WRITE, iova + 500, mr->rkey, other, 1000) == IBV_WC_SUCCESS);
    CHECK(has_pattern(mem + 500, 1000, 9));
    // Its own address is not the MR's any more.
    CHECK(peer_rdma(p, IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(mem), mr->rkey, other, 8) ==
          IBV_WC_REM_ACCESS_ERR);
    CHECK(ibv_dereg_mr(mr) == 0);
}
