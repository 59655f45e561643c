// ibv_resize_cq (completions waiting in the CQ survive; never below what is
// outstanding) and ibv_rereg_mr (translation, access and PD changes, seen by
// the peer through the same rkey), between two guests.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "verbs_fixture.h"

using namespace vt;

namespace {
constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// Sends `n` messages from a to b, wr_ids first..first+n-1 on both sides,
// and waits for a's send completions: an RC send completes only after the
// responder wrote its receive completion, so b's receive CQ then holds all
// `n`, unpolled.
void send_n(Qp& a, Qp& b, Buffer& src, Buffer& dst, uint64_t first, int n) {
    for (int i = 0; i < n; ++i) REQUIRE(post_recv(b.qp, first + uint64_t(i), {sge(dst, 64 * size_t(i), 64)}) == 0);
    for (int i = 0; i < n; ++i) {
        ibv_send_wr wr{};
        wr.wr_id = first + uint64_t(i);
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        REQUIRE(post_send(a.qp, wr, {sge(src, 64 * size_t(i), 64)}) == 0);
    }
    for (int i = 0; i < n; ++i) {
        auto w = poll_one(a.send_cq);
        REQUIRE(w);
        REQUIRE(w->status == IBV_WC_SUCCESS);
    }
}

std::vector<uint64_t> drain(ibv_cq* cq, size_t n) {
    std::vector<uint64_t> ids;
    while (ids.size() < n) {
        auto w = poll_one(cq);
        if (!w) break;
        CHECK(w->status == IBV_WC_SUCCESS);
        CHECK(w->opcode == IBV_WC_RECV);
        CHECK(w->byte_len == 64);
        ids.push_back(w->wr_id);
    }
    return ids;
}

std::vector<uint64_t> iota(uint64_t first, size_t n) {
    std::vector<uint64_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = first + i;
    return v;
}
}  // namespace

TEST_CASE("resize_cq grows and shrinks with completions waiting, never below them", "[cq][resize]") {
    Device dev, peer(Device::kPeer);
    ibv_cq* cq = ibv_create_cq(peer.ctx, 8, nullptr, nullptr, 0);  // b's receive CQ, under test
    REQUIRE(cq);
    QpOptions ob;
    ob.send_cq = ob.recv_cq = cq;
    {
        Qp a(dev), b(peer, ob);
        connect_rc(a.qp, peer.lid, b.qpn());
        connect_rc(b.qp, dev.lid, a.qpn());
        Buffer src(dev.pd, 4096, kAll), dst(peer.pd, 4096, kAll);
        const int cap = cq->cqe;
        REQUIRE(cap >= 8);

        // Six completions waiting; grow: they stay, in order, and the CQ now
        // takes more than it could before (no overrun).
        send_n(a, b, src, dst, 1, 6);
        REQUIRE(ibv_resize_cq(cq, 60) == 0);
        CHECK(cq->cqe >= 60);
        send_n(a, b, src, dst, 7, cap);
        CHECK(drain(cq, size_t(6 + cap)) == iota(1, size_t(6 + cap)));
        CHECK(cq_stays_empty(cq, 20));

        // Shrinking below the completions waiting is refused and loses none.
        send_n(a, b, src, dst, 100, 10);
        CHECK(ibv_resize_cq(cq, 4) == EINVAL);
        CHECK(ibv_resize_cq(cq, 9) == EINVAL);
        REQUIRE(ibv_resize_cq(cq, 10) == 0);
        CHECK(cq->cqe >= 10);
        CHECK(cq->cqe < 60);
        CHECK(drain(cq, 10) == iota(100, 10));
        CHECK(cq_stays_empty(cq, 20));

        // An empty CQ shrinks to anything; bad sizes are EINVAL.
        REQUIRE(ibv_resize_cq(cq, 2) == 0);
        CHECK(cq->cqe >= 2);
        CHECK(cq->cqe < 8);
        ibv_device_attr da{};
        REQUIRE(ibv_query_device(peer.ctx, &da) == 0);
        CHECK(ibv_resize_cq(cq, 0) == EINVAL);
        CHECK(ibv_resize_cq(cq, da.max_cqe + 1) == EINVAL);
        send_n(a, b, src, dst, 200, 2);
        CHECK(ibv_req_notify_cq(cq, 0) == 0);
        CHECK(drain(cq, 2) == iota(200, 2));
    }
    CHECK(ibv_destroy_cq(cq) == 0);
}

// Without a device the shim keeps an MR's keys across ibv_rereg_mr; a shim
// with a device registers the MR there anew, and its keys change, as verbs
// allow (scripts/test-hca.sh runs this suite through a device and sets
// VRDMA_TEST_DEVICE_KEYS=1): the peer then uses the new rkey.
static bool keys_kept_across_rereg() { return !std::getenv("VRDMA_TEST_DEVICE_KEYS"); }

TEST_CASE("rereg_mr changes access, translation and PD; the peer sees each through the (same) rkey",
          "[mr][rereg]") {
    Device dev, peer(Device::kPeer);
    Qp a(dev), b(peer);
    connect_rc(a.qp, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qpn());
    Buffer src(dev.pd, 4096, kAll);
    for (size_t i = 0; i < src.size; ++i) src.data[i] = uint8_t(i * 3 + 7);
    // The target: registered for local access only at first.
    Buffer dst(peer.pd, 8192, IBV_ACCESS_LOCAL_WRITE);
    Buffer other(peer.pd, 8192, IBV_ACCESS_LOCAL_WRITE);  // a second range for the translation change
    uint32_t rkey = dst.mr->rkey;

    auto write = [&](uint64_t remote, uint32_t len, uint64_t id) {
        ibv_send_wr wr{};
        wr.wr_id = id;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = rkey;
        REQUIRE(post_send(a.qp, wr, {sge(src, 0, len)}) == 0);
        auto w = poll_one(a.send_cq);
        REQUIRE(w);
        CHECK(w->wr_id == id);
        return w->status;
    };

    // Access: add remote write.
    auto keys_after_rereg = [&] {
        if (keys_kept_across_rereg()) CHECK(dst.mr->rkey == rkey);
        CHECK(dst.mr->lkey == dst.mr->rkey);
        rkey = dst.mr->rkey;
    };
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, kAll) == 0);
    keys_after_rereg();
    CHECK(write(dst.addr(100), 1000, 1) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.data + 100, src.data, 1000) == 0);

    // Translation: the MR's keys now name `other`'s memory.
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, other.data, other.size, 0) == 0);
    keys_after_rereg();
    CHECK(dst.mr->addr == other.data);
    CHECK(dst.mr->length == other.size);
    std::memset(dst.data, 0, 4096);
    CHECK(write(other.addr(4000), 2000, 2) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(other.data + 4000, src.data, 2000) == 0);
    CHECK(dst.data[0] == 0);

    // Refusals leave the MR as it was and set errno.
    errno = 0;
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE) ==
          IBV_REREG_MR_ERR_CMD);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_PD, dev.pd, nullptr, 0, 0) == IBV_REREG_MR_ERR_CMD);
    CHECK(errno == EINVAL);  // a PD of another context
    errno = 0;
    CHECK(ibv_rereg_mr(dst.mr, 0, nullptr, nullptr, 0, 0) == IBV_REREG_MR_ERR_CMD);
    CHECK(errno == EINVAL);
    CHECK(write(other.addr(0), 64, 3) == IBV_WC_SUCCESS);  // still usable as before

    // PD: moved to a PD the QP does not use; the rkey no longer works and
    // both QPs go to error.
    ibv_pd* pd2 = ibv_alloc_pd(peer.ctx);
    REQUIRE(pd2);
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0) == 0);
    keys_after_rereg();
    CHECK(dst.mr->pd == pd2);
    CHECK(ibv_dealloc_pd(pd2) == EBUSY);  // the MR holds it now
    CHECK(write(other.addr(0), 64, 4) == IBV_WC_REM_ACCESS_ERR);
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_PD, peer.pd, nullptr, 0, 0) == 0);
    CHECK(ibv_dealloc_pd(pd2) == 0);
}

TEST_CASE("rereg_mr to a PD the QP does not use: the local SGE fails with LOC_PROT_ERR", "[mr][rereg]") {
    Device dev, peer(Device::kPeer);
    Qp a(dev), b(peer);
    connect_rc(a.qp, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qpn());
    Buffer src(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE), dst(peer.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_pd* pd2 = ibv_alloc_pd(dev.ctx);
    REQUIRE(pd2);
    REQUIRE(post_recv(b.qp, 1, {sge(dst, 0, 64)}) == 0);
    ibv_send_wr wr{};
    wr.wr_id = 5;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    REQUIRE(post_send(a.qp, wr, {sge(src, 0, 64)}) == 0);
    REQUIRE(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
    REQUIRE(poll_one(b.recv_cq)->status == IBV_WC_SUCCESS);

    REQUIRE(ibv_rereg_mr(src.mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0) == 0);
    wr.wr_id = 6;
    REQUIRE(post_send(a.qp, wr, {sge(src, 0, 64)}) == 0);
    auto w = poll_one(a.send_cq);
    REQUIRE(w);
    CHECK(w->wr_id == 6);
    CHECK(w->status == IBV_WC_LOC_PROT_ERR);
    REQUIRE(ibv_rereg_mr(src.mr, IBV_REREG_MR_CHANGE_PD, dev.pd, nullptr, 0, 0) == 0);
    CHECK(ibv_dealloc_pd(pd2) == 0);
}
