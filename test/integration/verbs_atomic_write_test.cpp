// The atomic write of the extended QP API (ibv_wr_atomic_write, rdma-core
// 44): 8 bytes stored at an 8-byte aligned remote address at once, checked
// like an RDMA write, between two guests.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "verbs_fixture.h"

using namespace vt;

namespace {

// An RC QP created through ibv_create_qp_ex with the given send ops.
struct QpEx {
    QpEx(Device& dev, uint64_t ops) {
        cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
        REQUIRE(cq);
        ibv_qp_init_attr_ex ia{};
        ia.qp_type = IBV_QPT_RC;
        ia.send_cq = cq;
        ia.recv_cq = cq;
        ia.cap = {16, 16, 1, 1, 0};
        ia.pd = dev.pd;
        ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        ia.send_ops_flags = ops;
        qp = ibv_create_qp_ex(dev.ctx, &ia);
        REQUIRE(qp);
        qpx = ibv_qp_to_qp_ex(qp);
        REQUIRE(qpx);
    }
    ~QpEx() {
        ibv_destroy_qp(qp);
        ibv_destroy_cq(cq);
    }
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_qp_ex* qpx = nullptr;
};

ibv_wc atomic_write(QpEx& q, uint64_t id, uint32_t rkey, uint64_t addr, uint64_t value) {
    ibv_wr_start(q.qpx);
    q.qpx->wr_id = id;
    q.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(q.qpx, rkey, addr, &value);
    REQUIRE(ibv_wr_complete(q.qpx) == 0);
    auto w = poll_one(q.cq);
    REQUIRE(w);
    return *w;
}

}  // namespace

TEST_CASE("atomic write stores 8 bytes at once and is checked like a write", "[rc][atomic]") {
    Device dev, peer(Device::kPeer);
    QpEx a(dev, IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE);
    Qp b(peer);
    connect_rc(a.qp, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qp->qp_num);
    Buffer dst(peer.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    std::memset(dst.data, 0xee, 64);

    auto w = atomic_write(a, 1, dst.mr->rkey, dst.addr(16), 0x0123456789abcdefull);
    CHECK(w.status == IBV_WC_SUCCESS);
    CHECK(w.opcode == IBV_WC_ATOMIC_WRITE);
    CHECK(w.wr_id == 1);
    CHECK(w.qp_num == a.qp->qp_num);
    uint64_t got;
    std::memcpy(&got, dst.data + 16, 8);
    CHECK(got == 0x0123456789abcdefull);
    CHECK(dst.data[15] == 0xee);  // nothing around it moved
    CHECK(dst.data[24] == 0xee);
    CHECK(qp_state(b.qp) == IBV_QPS_RTS);

    // Several in a row, the last one wins.
    for (uint64_t v = 1; v <= 5; ++v) CHECK(atomic_write(a, 10 + v, dst.mr->rkey, dst.addr(32), v).status == IBV_WC_SUCCESS);
    std::memcpy(&got, dst.data + 32, 8);
    CHECK(got == 5);

    // Unaligned: an invalid request; both QPs go to error.
    CHECK(atomic_write(a, 2, dst.mr->rkey, dst.addr(4), 1).status == IBV_WC_REM_INV_REQ_ERR);
}

TEST_CASE("atomic write needs remote write access", "[rc][atomic]") {
    Device dev, peer(Device::kPeer);
    QpEx a(dev, IBV_QP_EX_WITH_ATOMIC_WRITE);
    Qp b(peer);
    connect_rc(a.qp, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qp->qp_num);
    Buffer ro(peer.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    std::memset(ro.data, 0, 16);
    CHECK(atomic_write(a, 3, ro.mr->rkey, ro.addr(0), ~0ull).status == IBV_WC_REM_ACCESS_ERR);
    CHECK(ro.data[0] == 0);
}

TEST_CASE("atomic write: only on RC, only through the extended API", "[rc][atomic][api]") {
    Device dev;
    Qp q(dev);
    connect_rc(q.qp, dev.lid, q.qpn());
    Buffer buf(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge s = sge(buf, 0, 8);
    ibv_send_wr wr{}, *bad = nullptr;
    wr.opcode = IBV_WR_ATOMIC_WRITE;
    wr.sg_list = &s;
    wr.num_sge = 1;
    CHECK(ibv_post_send(q.qp, &wr, &bad) == EINVAL);  // ibv_send_wr has no field for the value

    ibv_qp_init_attr_ex ia{};
    ia.send_cq = q.send_cq;
    ia.recv_cq = q.recv_cq;
    ia.cap = {4, 4, 1, 1, 0};
    ia.pd = dev.pd;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE;
    for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_UD}) {
        ia.qp_type = t;
        errno = 0;
        CHECK(ibv_create_qp_ex(dev.ctx, &ia) == nullptr);
        CHECK(errno == EOPNOTSUPP);
    }
}
