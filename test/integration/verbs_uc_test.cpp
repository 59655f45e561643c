// UC QPs between two guests: send and RDMA write without acknowledgements
// or retries; a message with no receive posted, or with a bad rkey, is lost
// while the sender still completes; the UC state machine.
#include <arpa/inet.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include <unistd.h>

#include "verbs_fixture.h"

using namespace vt;

namespace {
constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

QpOptions uc_options() {
    QpOptions o;
    o.type = IBV_QPT_UC;
    return o;
}

struct UcPair {
    UcPair(Device& d, Device& peer) : a(d, uc_options()), b(peer, uc_options()) {
        connect_uc(a.qp, peer.lid, b.qpn());
        connect_uc(b.qp, d.lid, a.qpn());
    }
    Qp a, b;
};

// Waits up to 2 s for a byte written by the peer (an unacknowledged write).
bool wait_for_byte(const uint8_t* p, uint8_t v) {
    for (int i = 0; i < 2000; ++i) {
        if (__atomic_load_n(p, __ATOMIC_ACQUIRE) == v) return true;
        usleep(1000);
    }
    return false;
}

ibv_wc send_ok(Qp& q, ibv_send_wr wr, std::vector<ibv_sge> sges) {
    wr.send_flags |= IBV_SEND_SIGNALED;
    REQUIRE(post_send(q.qp, wr, std::move(sges)) == 0);
    auto w = poll_one(q.send_cq);
    REQUIRE(w);
    return *w;
}
}  // namespace

TEST_CASE("UC: send, send with immediate and RDMA write arrive intact", "[uc]") {
    Device dev, peer(Device::kPeer);
    UcPair p(dev, peer);
    Buffer src(dev.pd, 8192, kAll), dst(peer.pd, 8192, kAll);
    for (size_t i = 0; i < src.size; ++i) src.data[i] = uint8_t(i * 11 + 5);

    REQUIRE(post_recv(p.b.qp, 50, {sge(dst, 0, 4096)}) == 0);
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htonl(0x11223344);
    auto s = send_ok(p.a, wr, {sge(src, 0, 3000), sge(src, 4096, 500)});
    CHECK(s.status == IBV_WC_SUCCESS);
    CHECK(s.opcode == IBV_WC_SEND);
    CHECK(s.wr_id == 1);
    CHECK(s.qp_num == p.a.qpn());
    auto r = poll_one(p.b.recv_cq);
    REQUIRE(r);
    CHECK(r->status == IBV_WC_SUCCESS);
    CHECK(r->opcode == IBV_WC_RECV);
    CHECK(r->wr_id == 50);
    CHECK(r->byte_len == 3500);
    CHECK((r->wc_flags & IBV_WC_WITH_IMM) != 0);
    CHECK(ntohl(r->imm_data) == 0x11223344);
    CHECK(r->qp_num == p.b.qpn());
    CHECK(r->src_qp == p.a.qpn());
    CHECK(r->slid == dev.lid);
    CHECK(std::memcmp(dst.data, src.data, 3000) == 0);
    CHECK(std::memcmp(dst.data + 3000, src.data + 4096, 500) == 0);

    // RDMA write: no receive consumed, no receive completion.
    wr = {};
    wr.wr_id = 2;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = dst.addr(5000);
    wr.wr.rdma.rkey = dst.mr->rkey;
    s = send_ok(p.a, wr, {sge(src, 100, 2000)});
    CHECK(s.status == IBV_WC_SUCCESS);
    CHECK(s.opcode == IBV_WC_RDMA_WRITE);
    // The write is not acknowledged: a following send on the same QP
    // arrives after it (order per QP), so its arrival shows the write landed.
    REQUIRE(post_recv(p.b.qp, 51, {sge(dst, 0, 64)}) == 0);
    wr = {};
    wr.wr_id = 3;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(7);
    wr.wr.rdma.remote_addr = dst.addr(7500);
    wr.wr.rdma.rkey = dst.mr->rkey;
    CHECK(send_ok(p.a, wr, {sge(src, 0, 100)}).status == IBV_WC_SUCCESS);
    r = poll_one(p.b.recv_cq);
    REQUIRE(r);
    CHECK(r->status == IBV_WC_SUCCESS);
    CHECK(r->opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(r->wr_id == 51);
    CHECK(r->byte_len == 100);
    CHECK(ntohl(r->imm_data) == 7);
    CHECK(std::memcmp(dst.data + 5000, src.data + 100, 2000) == 0);
    CHECK(std::memcmp(dst.data + 7500, src.data, 100) == 0);
}

TEST_CASE("UC: a message with no receive posted is dropped, the sender still succeeds", "[uc]") {
    Device dev, peer(Device::kPeer);
    UcPair p(dev, peer);
    Buffer src(dev.pd, 4096, kAll), dst(peer.pd, 4096, kAll);
    std::memset(src.data, 'x', 64);
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.opcode = IBV_WR_SEND;
    auto s = send_ok(p.a, wr, {sge(src, 0, 64)});
    CHECK(s.status == IBV_WC_SUCCESS);  // no RNR, no retry: the message is lost
    // The send completed when it left; it reaches b later across hosts. A
    // write behind it on the same QP shows when it has (order per QP).
    wr = {};
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = dst.addr(1000);
    wr.wr.rdma.rkey = dst.mr->rkey;
    src.data[100] = 'M';
    CHECK(send_ok(p.a, wr, {sge(src, 100, 1)}).status == IBV_WC_SUCCESS);
    REQUIRE(wait_for_byte(dst.data + 1000, 'M'));
    // A receive posted afterwards does not get the lost message...
    REQUIRE(post_recv(p.b.qp, 9, {sge(dst, 0, 64)}) == 0);
    CHECK(cq_stays_empty(p.b.recv_cq, 100));
    // ...but the next one; and a write with a bad rkey is lost too, the QPs stay up.
    wr = {};
    wr.wr_id = 2;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = dst.addr(0);
    wr.wr.rdma.rkey = dst.mr->rkey ^ 0x5a5a;
    CHECK(send_ok(p.a, wr, {sge(src, 0, 8)}).status == IBV_WC_SUCCESS);
    wr = {};
    wr.wr_id = 3;
    wr.opcode = IBV_WR_SEND;
    std::memset(src.data, 'y', 64);
    CHECK(send_ok(p.a, wr, {sge(src, 0, 64)}).status == IBV_WC_SUCCESS);
    auto r = poll_one(p.b.recv_cq);
    REQUIRE(r);
    CHECK(r->status == IBV_WC_SUCCESS);
    CHECK(r->wr_id == 9);
    CHECK(dst.data[0] == 'y');
    CHECK(qp_state(p.a.qp) == IBV_QPS_RTS);
    CHECK(qp_state(p.b.qp) == IBV_QPS_RTS);

    // A receive buffer too short: the receive completes with LOC_LEN_ERR, the QP stays up.
    REQUIRE(post_recv(p.b.qp, 10, {sge(dst, 0, 16)}) == 0);
    wr.wr_id = 4;
    CHECK(send_ok(p.a, wr, {sge(src, 0, 64)}).status == IBV_WC_SUCCESS);
    r = poll_one(p.b.recv_cq);
    REQUIRE(r);
    CHECK(r->wr_id == 10);
    CHECK(r->status == IBV_WC_LOC_LEN_ERR);
    CHECK(qp_state(p.b.qp) == IBV_QPS_RTS);
}

TEST_CASE("UC: a peer that is not there loses the message, nothing hangs", "[uc]") {
    Device dev, peer(Device::kPeer);
    Qp a(dev, uc_options()), b(peer, uc_options());
    connect_uc(a.qp, peer.lid, b.qpn());  // b stays in RESET
    Buffer src(dev.pd, 4096, kAll);
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.opcode = IBV_WR_SEND;
    CHECK(send_ok(a, wr, {sge(src, 0, 64)}).status == IBV_WC_SUCCESS);
    CHECK(qp_state(a.qp) == IBV_QPS_RTS);
}

TEST_CASE("UC: state machine and the operations it refuses", "[uc][api]") {
    Device dev;
    Qp q(dev, uc_options());
    ibv_qp_attr a{};
    // RESET -> INIT needs the access flags (not a qkey).
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = 1;
    CHECK(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == EINVAL);
    uc_init(q.qp);
    // INIT -> RTR refuses what only RC has.
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = q.qpn();
    a.ah_attr.dlid = dev.lid;
    a.ah_attr.port_num = 1;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    int base = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    CHECK(ibv_modify_qp(q.qp, &a, base | IBV_QP_MAX_DEST_RD_ATOMIC) == EINVAL);
    CHECK(ibv_modify_qp(q.qp, &a, base | IBV_QP_MIN_RNR_TIMER) == EINVAL);
    CHECK(ibv_modify_qp(q.qp, &a, base & ~IBV_QP_DEST_QPN) == EINVAL);
    REQUIRE(ibv_modify_qp(q.qp, &a, base) == 0);
    // RTR -> RTS: no timeout, retry counts or read depth.
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    CHECK(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT) == EINVAL);
    CHECK(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT) == EINVAL);
    REQUIRE(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
    CHECK(qp_state(q.qp) == IBV_QPS_RTS);

    // UC has no READ and no atomics.
    Buffer buf(dev.pd, 4096, kAll);
    ibv_send_wr wr{}, *bad = nullptr;
    ibv_sge s = sge(buf, 0, 8);
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    CHECK(ibv_post_send(q.qp, &wr, &bad) == EINVAL);
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    CHECK(ibv_post_send(q.qp, &wr, &bad) == EINVAL);

    // A local error (bad lkey) takes the send queue to SQE; SQE -> RTS recovers it.
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    s.lkey ^= 0x5a5a;
    REQUIRE(ibv_post_send(q.qp, &wr, &bad) == 0);
    auto w = poll_one(q.send_cq);
    REQUIRE(w);
    CHECK(w->status == IBV_WC_LOC_PROT_ERR);
    CHECK(qp_state(q.qp) == IBV_QPS_SQE);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    REQUIRE(ibv_modify_qp(q.qp, &a, IBV_QP_STATE) == 0);
    CHECK(qp_state(q.qp) == IBV_QPS_RTS);

    ibv_qp_init_attr_ex ia{};
    ia.qp_type = IBV_QPT_UC;
    ia.send_cq = q.send_cq;
    ia.recv_cq = q.recv_cq;
    ia.cap = {4, 4, 1, 1, 0};
    ia.pd = dev.pd;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ;
    errno = 0;
    CHECK(ibv_create_qp_ex(dev.ctx, &ia) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
    ibv_qp* ex = ibv_create_qp_ex(dev.ctx, &ia);
    REQUIRE(ex);
    CHECK(ibv_destroy_qp(ex) == 0);
}
