// Multicast through the real libibverbs (ibv_attach_mcast, ibv_detach_mcast
// and a UD send to a multicast address): every UD QP attached to the group,
// on this guest and on the peer (another guest, possibly on another shim),
// gets one copy with a GRH that names the group; QPs not attached get none.
#include <arpa/inet.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "verbs_fixture.h"

using namespace vt;

namespace {
constexpr uint32_t kQkey = 0x22222222;
constexpr int kLocal = IBV_ACCESS_LOCAL_WRITE;
constexpr uint32_t kMulticastQpn = 0xffffff;
// The MLID an application names when it attaches (any multicast LID: the
// group's own comes from its MGID, and a GRH names the group).
constexpr uint16_t kMlid = 0xc001;

// An IPoIB-style MGID (ff12:401b:ffff::) ending in `tail`, with this
// process's id in it: groups are the shim's, and verbs.sh runs two
// instances of this program at once, whose groups must not meet.
ibv_gid group_gid(uint32_t tail) {
    ibv_gid g{};
    const uint8_t head[] = {0xff, 0x12, 0x40, 0x1b, 0xff, 0xff};
    std::memcpy(g.raw, head, sizeof(head));
    const uint32_t pid = htonl(uint32_t(getpid()));
    std::memcpy(g.raw + 8, &pid, 4);
    tail = htonl(tail);
    std::memcpy(g.raw + 12, &tail, 4);
    return g;
}

// An address handle to group `mgid`: any multicast LID with a GRH reaches
// the group the GRH names.
ibv_ah* group_ah(Device& dev, const ibv_gid& mgid) {
    ibv_ah_attr aa{};
    aa.dlid = kMlid;
    aa.port_num = 1;
    aa.is_global = 1;
    aa.grh.dgid = mgid;
    aa.grh.hop_limit = 1;
    ibv_ah* ah = ibv_create_ah(dev.pd, &aa);
    REQUIRE(ah);
    return ah;
}

ibv_ah* unicast_ah(Device& dev, Device& to) {
    ibv_ah_attr aa{};
    aa.dlid = to.lid;
    aa.port_num = 1;
    ibv_ah* ah = ibv_create_ah(dev.pd, &aa);
    REQUIRE(ah);
    return ah;
}

// Sends `len` bytes of pattern `seed` from `src` through `ah` to `qpn`.
void send_ud(Qp& from, Buffer& src, ibv_ah* ah, uint32_t qpn, uint32_t len, uint8_t seed, uint64_t wr_id) {
    pattern(src.data, len, seed);
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qpn;
    wr.wr.ud.remote_qkey = kQkey;
    REQUIRE(post_send(from.qp, wr, {sge(src, 0, len)}) == 0);
    auto s = poll_one(from.send_cq);
    REQUIRE(s);
    CHECK(s->status == IBV_WC_SUCCESS);
    CHECK(s->wr_id == wr_id);
}

// The next receive on `qp` is the multicast datagram of `len` bytes of
// pattern `seed` from `sender` to group `mgid`.
void expect_copy(Qp& qp, Buffer& dst, Qp& sender, Device& from, const ibv_gid& mgid, uint32_t len, uint8_t seed) {
    auto r = poll_one(qp.recv_cq);
    REQUIRE(r);
    CHECK(r->status == IBV_WC_SUCCESS);
    CHECK(r->opcode == IBV_WC_RECV);
    CHECK(r->byte_len == 40 + len);
    CHECK(r->src_qp == sender.qpn());
    CHECK(r->slid == from.lid);
    CHECK((r->wc_flags & IBV_WC_GRH));
    // The GRH: destination GID the group, source GID the sender's port.
    ibv_gid sgid{};
    REQUIRE(ibv_query_gid(from.ctx, 1, 0, &sgid) == 0);
    CHECK(std::memcmp(dst.data + 24, mgid.raw, 16) == 0);
    CHECK(std::memcmp(dst.data + 8, sgid.raw, 16) == 0);
    CHECK(has_pattern(dst.data + 40, len, seed));
}
}  // namespace

TEST_CASE("Multicast: each attached UD QP gets one copy, here and at the peer; others get none", "[mcast]") {
    Device dev, peer(Device::kPeer);
    ibv_device_attr attr{};
    REQUIRE(ibv_query_device(dev.ctx, &attr) == 0);
    CHECK(attr.max_mcast_grp > 0);
    CHECK(attr.max_mcast_qp_attach > 0);
    CHECK(attr.max_total_mcast_qp_attach >= attr.max_mcast_qp_attach);

    QpOptions ud;
    ud.type = IBV_QPT_UD;
    Qp sender(dev, ud), near(dev, ud), far1(peer, ud), far2(peer, ud), other(peer, ud);
    for (Qp* q : {&sender, &near, &far1, &far2, &other}) bring_up_ud(q->qp, kQkey);
    const ibv_gid mgid = group_gid(0xe0000101), elsewhere = group_gid(0xe0000102);
    REQUIRE(ibv_attach_mcast(near.qp, &mgid, kMlid) == 0);
    REQUIRE(ibv_attach_mcast(far1.qp, &mgid, kMlid) == 0);
    REQUIRE(ibv_attach_mcast(far2.qp, &mgid, kMlid) == 0);
    REQUIRE(ibv_attach_mcast(far2.qp, &mgid, kMlid) == 0);  // twice: still one copy
    REQUIRE(ibv_attach_mcast(other.qp, &elsewhere, kMlid) == 0);

    Buffer src(dev.pd, 4096, kLocal);
    Buffer dnear(dev.pd, 8192, kLocal), d1(peer.pd, 8192, kLocal), d2(peer.pd, 8192, kLocal),
        dother(peer.pd, 8192, kLocal);
    ibv_ah* to_group = group_ah(dev, mgid);
    uint8_t seed = 1;
    // A small datagram and one of the full MTU (larger than any inline
    // copy the shim keeps: the path between workers and shims for those).
    for (uint32_t len : {100u, 4096u}) {
        INFO("payload " << len);
        REQUIRE(post_recv(near.qp, 1, {sge(dnear, 0, 40 + 4096)}) == 0);
        REQUIRE(post_recv(far1.qp, 1, {sge(d1, 0, 40 + 4096)}) == 0);
        REQUIRE(post_recv(far2.qp, 1, {sge(d2, 0, 40 + 4096)}) == 0);
        REQUIRE(post_recv(far2.qp, 2, {sge(d2, 4096, 2048)}) == 0);
        REQUIRE(post_recv(other.qp, 1, {sge(dother, 0, 40 + 4096)}) == 0);
        send_ud(sender, src, to_group, kMulticastQpn, len, seed, 10);
        expect_copy(near, dnear, sender, dev, mgid, len, seed);
        expect_copy(far1, d1, sender, dev, mgid, len, seed);
        expect_copy(far2, d2, sender, dev, mgid, len, seed);
        ++seed;
        // far2's second receive and `other`'s stay: a unicast datagram to
        // each is the next completion they see.
        ibv_ah* to_peer = unicast_ah(dev, peer);
        send_ud(sender, src, to_peer, far2.qpn(), 8, 99, 11);
        auto r = poll_one(far2.recv_cq);
        REQUIRE(r);
        CHECK(r->wr_id == 2);
        CHECK(r->byte_len == 40 + 8);
        CHECK(!(r->wc_flags & IBV_WC_GRH));
        send_ud(sender, src, to_peer, other.qpn(), 8, 99, 12);
        r = poll_one(other.recv_cq);
        REQUIRE(r);
        CHECK(r->byte_len == 40 + 8);
        CHECK(!(r->wc_flags & IBV_WC_GRH));
        REQUIRE(ibv_destroy_ah(to_peer) == 0);
    }

    // Detached: far1 gets no more; the others still do.
    REQUIRE(ibv_detach_mcast(far1.qp, &mgid, kMlid) == 0);
    CHECK(ibv_detach_mcast(far1.qp, &mgid, kMlid) == EINVAL);
    REQUIRE(post_recv(far1.qp, 3, {sge(d1, 0, 40 + 4096)}) == 0);
    REQUIRE(post_recv(far2.qp, 3, {sge(d2, 0, 40 + 4096)}) == 0);
    REQUIRE(post_recv(near.qp, 3, {sge(dnear, 0, 40 + 4096)}) == 0);
    send_ud(sender, src, to_group, kMulticastQpn, 64, seed, 13);
    expect_copy(far2, d2, sender, dev, mgid, 64, seed);
    expect_copy(near, dnear, sender, dev, mgid, 64, seed);
    CHECK(cq_stays_empty(far1.recv_cq, 200));

    // A datagram to the group's address but not to QPN 0xffffff reaches
    // nobody (IB delivers multicast to that QPN only); the send succeeds.
    REQUIRE(post_recv(far2.qp, 4, {sge(d2, 0, 40 + 4096)}) == 0);
    send_ud(sender, src, to_group, far2.qpn(), 64, seed, 14);
    CHECK(cq_stays_empty(far2.recv_cq, 200));
    REQUIRE(ibv_destroy_ah(to_group) == 0);
}

TEST_CASE("Multicast: attaching checks the QP type, the GID and the LID; a destroyed QP leaves its groups",
          "[mcast]") {
    Device dev, peer(Device::kPeer);
    const ibv_gid mgid = group_gid(0xe0000201);
    Qp rc(dev);
    CHECK(ibv_attach_mcast(rc.qp, &mgid, kMlid) == EINVAL);
    QpOptions ud;
    ud.type = IBV_QPT_UD;
    Qp member(peer, ud), sender(dev, ud);
    bring_up_ud(member.qp, kQkey);
    bring_up_ud(sender.qp, kQkey);
    ibv_gid unicast{};
    REQUIRE(ibv_query_gid(dev.ctx, 1, 0, &unicast) == 0);
    CHECK(ibv_attach_mcast(member.qp, &unicast, kMlid) == EINVAL);
    CHECK(ibv_attach_mcast(member.qp, &mgid, 0x1234) == EINVAL);  // a unicast LID, as the kernel checks
    CHECK(ibv_detach_mcast(member.qp, &mgid, kMlid) == EINVAL);  // never attached

    // A QP destroyed while attached: the group's other member still gets
    // the datagram, and nothing reaches the QP's number.
    {
        Qp doomed(peer, ud);
        bring_up_ud(doomed.qp, kQkey);
        REQUIRE(ibv_attach_mcast(doomed.qp, &mgid, kMlid) == 0);
    }
    REQUIRE(ibv_attach_mcast(member.qp, &mgid, kMlid) == 0);
    Buffer src(dev.pd, 4096, kLocal), dst(peer.pd, 8192, kLocal);
    REQUIRE(post_recv(member.qp, 1, {sge(dst, 0, 40 + 4096)}) == 0);
    ibv_ah* ah = group_ah(dev, mgid);
    send_ud(sender, src, ah, kMulticastQpn, 256, 5, 1);
    expect_copy(member, dst, sender, dev, mgid, 256, 5);
    // A member whose Q_Key differs from the datagram's drops it.
    ibv_qp_attr qa{};
    qa.qkey = kQkey + 1;
    REQUIRE(ibv_modify_qp(member.qp, &qa, IBV_QP_QKEY) == 0);
    REQUIRE(post_recv(member.qp, 2, {sge(dst, 0, 40 + 4096)}) == 0);
    send_ud(sender, src, ah, kMulticastQpn, 256, 6, 2);
    CHECK(cq_stays_empty(member.recv_cq, 200));
    REQUIRE(ibv_destroy_ah(ah) == 0);
}
