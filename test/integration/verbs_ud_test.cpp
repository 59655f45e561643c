// UD semantics through the real libibverbs: a UD QP on vrdma0 sends to one
// on the peer device (vrdma1, another guest, when there is one; see
// verbs_fixture.h).
#include <arpa/inet.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "verbs_fixture.h"

using namespace vt;

namespace {
constexpr uint32_t kQkey = 0x11111111;
constexpr int kLocal = IBV_ACCESS_LOCAL_WRITE;

// An address handle on dev's PD towards the port of `to`.
ibv_ah* make_ah(Device& dev, Device& to, bool global) {
    ibv_ah_attr aa{};
    aa.dlid = to.lid;
    aa.port_num = 1;
    if (global) {
        aa.is_global = 1;
        REQUIRE(ibv_query_gid(to.ctx, 1, 0, &aa.grh.dgid) == 0);
        aa.grh.hop_limit = 1;
    }
    ibv_ah* ah = ibv_create_ah(dev.pd, &aa);
    REQUIRE(ah);
    return ah;
}
}  // namespace

TEST_CASE("UD datagrams: 40 bytes of GRH space, source QP and LID in the completion", "[ud]") {
    Device dev, peer(Device::kPeer);
    QpOptions ud;
    ud.type = IBV_QPT_UD;
    Qp a(dev, ud), b(peer, ud);
    bring_up_ud(a.qp, kQkey);
    bring_up_ud(b.qp, kQkey);
    Buffer src(dev.pd, 8192, kLocal), dst(peer.pd, 8192, kLocal);
    for (int i = 0; i < 4096; ++i) src.data[i] = uint8_t(i * 13);

    for (bool global : {false, true}) {
        INFO("global AH: " << global);
        ibv_ah* ah = make_ah(dev, peer, global);
        std::memset(dst.data, 0, dst.size);
        REQUIRE(post_recv(b.qp, 5, {sge(dst, 0, 40 + 4096)}) == 0);
        ibv_send_wr wr{};
        wr.wr_id = 6;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.imm_data = htonl(7);
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = b.qpn();
        wr.wr.ud.remote_qkey = kQkey;
        REQUIRE(post_send(a.qp, wr, {sge(src, 0, 4096)}) == 0);
        auto s = poll_one(a.send_cq);
        REQUIRE(s);
        CHECK(s->status == IBV_WC_SUCCESS);
        CHECK(s->opcode == IBV_WC_SEND);
        auto r = poll_one(b.recv_cq);
        REQUIRE(r);
        CHECK(r->status == IBV_WC_SUCCESS);
        CHECK(r->opcode == IBV_WC_RECV);
        CHECK(r->byte_len == 40 + 4096);
        CHECK(r->src_qp == a.qpn());
        CHECK(r->slid == dev.lid);
        CHECK(r->qp_num == b.qpn());
        CHECK((r->wc_flags & IBV_WC_WITH_IMM));
        CHECK(ntohl(r->imm_data) == 7);
        // Through a RoCE device (the suite in scripts/test-hca.sh) every
        // datagram has a GRH, as on RoCE: whether the sender's AH was global
        // does not travel with it.
        if (through_rxe())
            CHECK((r->wc_flags & IBV_WC_GRH));
        else
            CHECK(bool(r->wc_flags & IBV_WC_GRH) == global);
        if (r->wc_flags & IBV_WC_GRH) {
            // The guests' GIDs, never the host's addresses.
            ibv_gid from{}, to{};
            REQUIRE(ibv_query_gid(dev.ctx, 1, 0, &from) == 0);
            REQUIRE(ibv_query_gid(peer.ctx, 1, 0, &to) == 0);
            CHECK(dst.data[0] >> 4 == 6);
            CHECK(std::memcmp(dst.data + 8, from.raw, 16) == 0);
            CHECK(std::memcmp(dst.data + 24, to.raw, 16) == 0);
        }
        CHECK(std::memcmp(dst.data + 40, src.data, 4096) == 0);
        ibv_destroy_ah(ah);
    }
}

TEST_CASE("UD: a wrong qkey or a missing QP drops the datagram; the sender still succeeds", "[ud]") {
    Device dev, peer(Device::kPeer);
    QpOptions ud;
    ud.type = IBV_QPT_UD;
    Qp a(dev, ud), b(peer, ud);
    bring_up_ud(a.qp, kQkey);
    bring_up_ud(b.qp, kQkey);
    Buffer buf(dev.pd, 4096, kLocal), rbuf(peer.pd, 4096, kLocal);
    ibv_ah* ah = make_ah(dev, peer, false);
    REQUIRE(post_recv(b.qp, 1, {sge(rbuf, 0, 1024)}) == 0);
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = b.qpn();
    wr.wr.ud.remote_qkey = kQkey + 1;
    REQUIRE(post_send(a.qp, wr, {sge(buf, 2048, 16)}) == 0);
    REQUIRE(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
    wr.wr.ud.remote_qpn = 0xfffff0;
    wr.wr.ud.remote_qkey = kQkey;
    REQUIRE(post_send(a.qp, wr, {sge(buf, 2048, 16)}) == 0);
    REQUIRE(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
    CHECK(cq_stays_empty(b.recv_cq, 100));
    // The right qkey still gets through afterwards.
    wr.wr.ud.remote_qpn = b.qpn();
    REQUIRE(post_send(a.qp, wr, {sge(buf, 2048, 16)}) == 0);
    REQUIRE(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
    auto r = poll_one(b.recv_cq);
    REQUIRE(r);
    CHECK(r->status == IBV_WC_SUCCESS);
    CHECK(r->byte_len == 56);
    ibv_destroy_ah(ah);
}
