// Events through the real libibverbs on vrdma0 (docs/protocol.md "Events"):
// every affiliated async event a guest can provoke, with its type and its
// element (the right QP, CQ or SRQ pointer); completion channels (arming,
// solicited-only, several CQs on one channel, no lost wake-up, poll/epoll,
// destroy with unacknowledged events); and the RDMA netlink hiding of the
// preloaded provider. The two ends of every connection are on different
// devices: the local end on vrdma0, the remote end on the peer device
// (vrdma1, another guest, possibly behind another shim on another host,
// when the program runs attached to two guests; see verbs_fixture.h), so an
// event is expected on the async fd of the device that holds its object.
// Port events and DEVICE_FATAL need the operator or the shim's death:
// events_port.sh and events_shim_stop.sh.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "verbs_fixture.h"

#ifndef NETLINK_RDMA
#define NETLINK_RDMA 20
#endif

// LeakSanitizer's interface when the test runs instrumented (weak: absent
// otherwise).
extern "C" void __lsan_ignore_object(const void* p) __attribute__((weak));

using namespace vt;

namespace {
constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_REMOTE_ATOMIC;

// The next async event of `ctx` within timeout_ms whose type is `type`
// (other events on the way are acknowledged and skipped). The event is
// acknowledged before it is returned: only its type and element matter.
std::optional<ibv_async_event> wait_async(ibv_context* ctx, ibv_event_type type, int timeout_ms = 2000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
                           .count());
        if (left < 0) left = 0;
        pollfd p{ctx->async_fd, POLLIN, 0};
        if (poll(&p, 1, left) != 1) return std::nullopt;
        ibv_async_event ev{};
        if (ibv_get_async_event(ctx, &ev)) return std::nullopt;
        ibv_async_event copy = ev;
        ibv_ack_async_event(&ev);
        if (copy.event_type == type) return copy;
        UNSCOPED_INFO("skipped async event " << ibv_event_type_str(copy.event_type));
    }
}

// No async event at all within ms.
bool async_quiet(ibv_context* ctx, int ms) {
    pollfd p{ctx->async_fd, POLLIN, 0};
    return poll(&p, 1, ms) == 0;
}

bool readable(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

// A QP on CQs the test made (the fixture's Qp makes its own).
ibv_qp* make_qp(Device& dev, ibv_cq* scq, ibv_cq* rcq, ibv_srq* srq = nullptr, ibv_qp_type type = IBV_QPT_RC) {
    ibv_qp_init_attr ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.srq = srq;
    ia.qp_type = type;
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = srq ? 0 : 64;
    ia.cap.max_send_sge = 2;
    ia.cap.max_recv_sge = srq ? 0 : 2;
    ibv_qp* qp = ibv_create_qp(dev.pd, &ia);
    REQUIRE(qp);
    return qp;
}

// INIT then RTR towards (lid, remote_qpn), not RTS.
void to_rtr(ibv_qp* qp, uint16_t lid, uint32_t remote_qpn) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = remote_qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    REQUIRE(ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
}

ibv_send_wr send_wr(uint64_t id, ibv_wr_opcode op = IBV_WR_SEND, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.opcode = op;
    wr.send_flags = flags;
    return wr;
}

// Two QPs whose CQs all belong to one completion channel per QP: chan_a for
// a's CQs, chan_b for b's; a and its channel on d, b and its channel on the
// peer device. Torn down in the order libibverbs requires.
struct ChannelPair {
    ChannelPair(Device& d, Device& peer, bool connect = true) : dev(d) {
        chan_a = ibv_create_comp_channel(d.ctx);
        chan_b = ibv_create_comp_channel(peer.ctx);
        REQUIRE(chan_a);
        REQUIRE(chan_b);
        a_scq = ibv_create_cq(d.ctx, 64, &tag_a_scq, chan_a, 0);
        a_rcq = ibv_create_cq(d.ctx, 64, &tag_a_rcq, chan_a, 0);
        b_scq = ibv_create_cq(peer.ctx, 64, &tag_b_scq, chan_b, 0);
        b_rcq = ibv_create_cq(peer.ctx, 64, &tag_b_rcq, chan_b, 0);
        REQUIRE((a_scq && a_rcq && b_scq && b_rcq));
        a = make_qp(d, a_scq, a_rcq);
        b = make_qp(peer, b_scq, b_rcq);
        if (connect) {
            connect_rc(a, peer.lid, b->qp_num);
            connect_rc(b, d.lid, a->qp_num);
        }
    }
    ~ChannelPair() {
        ibv_destroy_qp(a);
        ibv_destroy_qp(b);
        for (ibv_cq* c : {a_scq, a_rcq, b_scq, b_rcq}) ibv_destroy_cq(c);
        ibv_destroy_comp_channel(chan_a);
        ibv_destroy_comp_channel(chan_b);
    }
    Device& dev;
    int tag_a_scq = 0, tag_a_rcq = 0, tag_b_scq = 0, tag_b_rcq = 0;
    ibv_comp_channel* chan_a = nullptr;
    ibv_comp_channel* chan_b = nullptr;
    ibv_cq *a_scq = nullptr, *a_rcq = nullptr, *b_scq = nullptr, *b_rcq = nullptr;
    ibv_qp *a = nullptr, *b = nullptr;
};

// ibv_get_cq_event within ms (the channel fd is polled first so that a lost
// event fails the test instead of hanging it); acknowledges the event.
ibv_cq* get_cq_event(ibv_comp_channel* ch, int ms = 2000, void** cq_context = nullptr) {
    if (!readable(ch->fd, ms)) return nullptr;
    ibv_cq* cq = nullptr;
    void* c = nullptr;
    if (ibv_get_cq_event(ch, &cq, &c)) return nullptr;
    ibv_ack_cq_events(cq, 1);
    if (cq_context) *cq_context = c;
    return cq;
}
}  // namespace

// ---------------------------------------------------------------------------
// Affiliated async events
// ---------------------------------------------------------------------------

TEST_CASE("COMM_EST: the first request reaching an RC QP in RTR, once, on that QP", "[events][async]") {
    Device dev, peer(Device::kPeer);
    Qp a(dev), b(peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    connect_rc(a.qp, peer.lid, b.qpn());
    to_rtr(b.qp, dev.lid, a.qpn());
    REQUIRE(post_recv(b.qp, 1, {sge(rbuf, 0, 64)}) == 0);
    REQUIRE(post_recv(b.qp, 2, {sge(rbuf, 64, 64)}) == 0);
    REQUIRE(post_send(a.qp, send_wr(10), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
    auto ev = wait_async(peer.ctx, IBV_EVENT_COMM_EST);
    REQUIRE(ev);
    CHECK(ev->element.qp == b.qp);
    REQUIRE(post_send(a.qp, send_wr(11), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
    CHECK(async_quiet(peer.ctx, 200));  // not again for the second request
    CHECK(async_quiet(dev.ctx, 0));     // nor on the requester's device
}

TEST_CASE("QP_REQ_ERR: a SEND larger than the receive buffer, on the responder QP", "[events][async]") {
    Device dev, peer(Device::kPeer);
    Qp a(dev), b(peer);
    connect_rc(a.qp, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qpn());
    Buffer buf(dev.pd, 8192, kAll), rbuf(peer.pd, 8192, kAll);
    REQUIRE(post_recv(b.qp, 1, {sge(rbuf, 0, 16)}) == 0);
    REQUIRE(post_send(a.qp, send_wr(1), {sge(buf, 4096, 1000)}) == 0);
    CHECK(poll_one(a.send_cq)->status == IBV_WC_REM_INV_REQ_ERR);
    auto ev = wait_async(peer.ctx, IBV_EVENT_QP_REQ_ERR);
    REQUIRE(ev);
    CHECK(ev->element.qp == b.qp);
    CHECK(qp_state(b.qp) == IBV_QPS_ERR);
}

TEST_CASE("QP_ACCESS_ERR: an RDMA WRITE with a bad rkey, on the responder QP", "[events][async]") {
    Device dev, peer(Device::kPeer);
    Qp a(dev), b(peer);
    connect_rc(a.qp, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qpn());
    Buffer src(dev.pd, 4096, kAll), dst(peer.pd, 4096, kAll);
    ibv_send_wr wr = send_wr(1, IBV_WR_RDMA_WRITE);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.mr->rkey ^ 0x5a5a00;
    REQUIRE(post_send(a.qp, wr, {sge(src, 0, 64)}) == 0);
    CHECK(poll_one(a.send_cq)->status == IBV_WC_REM_ACCESS_ERR);
    auto ev = wait_async(peer.ctx, IBV_EVENT_QP_ACCESS_ERR);
    REQUIRE(ev);
    CHECK(ev->element.qp == b.qp);
}

TEST_CASE("QP_FATAL: a receive WQE with a bad lkey at the responder, on that QP", "[events][async]") {
    Device dev, peer(Device::kPeer);
    Qp a(dev), b(peer);
    connect_rc(a.qp, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qpn());
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    ibv_sge bad = sge(rbuf, 0, 64);
    bad.lkey ^= 0x777700;
    REQUIRE(post_recv(b.qp, 1, {bad}) == 0);
    REQUIRE(post_send(a.qp, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    CHECK(poll_one(a.send_cq)->status == IBV_WC_REM_OP_ERR);
    auto ev = wait_async(peer.ctx, IBV_EVENT_QP_FATAL);
    REQUIRE(ev);
    CHECK(ev->element.qp == b.qp);
}

TEST_CASE("QP_FATAL: the peer QP's context goes away with the QP alive, on the surviving QP", "[events][async]") {
    Device dev;
    Qp b(dev);
    {
        // A second context of this process on the peer device, closed with
        // its QP still alive: for the shim that is the peer process exiting.
        const std::string peer_name = peer_device_name();
        int n = 0;
        ibv_device** list = ibv_get_device_list(&n);
        REQUIRE(list);
        ibv_context* other = nullptr;
        for (int i = 0; i < n && !other; ++i)
            if (ibv_get_device_name(list[i]) == peer_name) other = ibv_open_device(list[i]);
        ibv_free_device_list(list);
        REQUIRE(other);
        ibv_pd* pd = ibv_alloc_pd(other);
        REQUIRE(pd);
        ibv_cq* cq = ibv_create_cq(other, 16, nullptr, nullptr, 0);
        REQUIRE(cq);
        ibv_qp_init_attr ia{};
        ia.send_cq = ia.recv_cq = cq;
        ia.qp_type = IBV_QPT_RC;
        ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
        ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
        ibv_qp* a = ibv_create_qp(pd, &ia);
        REQUIRE(a);
        ibv_port_attr pa{};
        REQUIRE(ibv_query_port(other, 1, &pa) == 0);
        connect_rc(a, dev.lid, b.qpn());
        connect_rc(b.qp, pa.lid, a->qp_num);
        CHECK(async_quiet(dev.ctx, 100));
        // a, cq and pd are never destroyed, as when a process exits; under
        // LeakSanitizer that is on purpose.
        if (__lsan_ignore_object) {
            __lsan_ignore_object(a);
            __lsan_ignore_object(cq);
            __lsan_ignore_object(pd);
        }
        ibv_close_device(other);
    }
    auto ev = wait_async(dev.ctx, IBV_EVENT_QP_FATAL);
    REQUIRE(ev);
    CHECK(ev->element.qp == b.qp);
    CHECK(qp_state(b.qp) == IBV_QPS_ERR);
}

TEST_CASE("SQ_DRAINED: RTS -> SQD with en_sqd_async_notify, on that QP; SQD -> RTS works", "[events][async][sqd]") {
    Device dev, peer(Device::kPeer);
    Qp a(dev), b(peer);
    connect_rc(a.qp, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qpn());
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    attr.en_sqd_async_notify = 1;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
    auto ev = wait_async(dev.ctx, IBV_EVENT_SQ_DRAINED);
    REQUIRE(ev);
    CHECK(ev->element.qp == a.qp);
    CHECK(qp_state(a.qp) == IBV_QPS_SQD);
    // Without en_sqd_async_notify: no event.
    attr = {};
    attr.qp_state = IBV_QPS_RTS;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    attr.qp_state = IBV_QPS_SQD;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    CHECK(async_quiet(dev.ctx, 200));
    CHECK(async_quiet(peer.ctx, 0));
    attr.qp_state = IBV_QPS_RTS;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    REQUIRE(post_recv(b.qp, 1, {sge(rbuf, 0, 64)}) == 0);
    REQUIRE(post_send(a.qp, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    CHECK(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
}

TEST_CASE("QP_LAST_WQE_REACHED: an SRQ-attached QP going to ERR, on that QP", "[events][async][srq]") {
    Device dev, peer(Device::kPeer);
    ibv_srq_init_attr sia{};
    sia.attr.max_wr = 16;
    sia.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(peer.pd, &sia);
    REQUIRE(srq);
    {
        QpOptions with_srq;
        with_srq.srq = srq;
        Qp s(dev), r(peer, with_srq), plain(peer);
        connect_rc(s.qp, peer.lid, r.qpn());
        connect_rc(r.qp, dev.lid, s.qpn());
        connect_rc(plain.qp, dev.lid, s.qpn());
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_ERR;
        REQUIRE(ibv_modify_qp(plain.qp, &attr, IBV_QP_STATE) == 0);  // no SRQ: no event
        CHECK(async_quiet(peer.ctx, 200));
        CHECK(async_quiet(dev.ctx, 0));
        REQUIRE(ibv_modify_qp(r.qp, &attr, IBV_QP_STATE) == 0);
        auto ev = wait_async(peer.ctx, IBV_EVENT_QP_LAST_WQE_REACHED);
        REQUIRE(ev);
        CHECK(ev->element.qp == r.qp);
    }
    CHECK(ibv_destroy_srq(srq) == 0);
}

TEST_CASE("SRQ_LIMIT_REACHED: armed by ibv_modify_srq, once, on that SRQ", "[events][async][srq]") {
    Device dev, peer(Device::kPeer);
    ibv_srq_init_attr sia{};
    sia.attr.max_wr = 16;
    sia.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(peer.pd, &sia);
    REQUIRE(srq);
    Buffer buf(dev.pd, 8192, kAll), rbuf(peer.pd, 8192, kAll);
    for (int i = 0; i < 6; ++i) {
        ibv_sge s = sge(rbuf, 4096 + i * 64, 64);
        ibv_recv_wr wr{};
        ibv_recv_wr* bad = nullptr;
        wr.wr_id = 100 + i;
        wr.sg_list = &s;
        wr.num_sge = 1;
        REQUIRE(ibv_post_srq_recv(srq, &wr, &bad) == 0);
    }
    ibv_srq_attr sa{};
    sa.srq_limit = 4;
    REQUIRE(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0);
    {
        QpOptions with_srq;
        with_srq.srq = srq;
        Qp s(dev), r(peer, with_srq);
        connect_rc(s.qp, peer.lid, r.qpn());
        connect_rc(r.qp, dev.lid, s.qpn());
        auto send_one = [&] {
            REQUIRE(post_send(s.qp, send_wr(1), {sge(buf, 0, 8)}) == 0);
            REQUIRE(poll_one(s.send_cq)->status == IBV_WC_SUCCESS);
            REQUIRE(poll_one(r.recv_cq)->status == IBV_WC_SUCCESS);
        };
        send_one();  // 5 left: not below 4
        send_one();  // 4 left: not below 4
        CHECK(async_quiet(peer.ctx, 200));
        send_one();  // 3 left: below the limit
        auto ev = wait_async(peer.ctx, IBV_EVENT_SRQ_LIMIT_REACHED);
        REQUIRE(ev);
        CHECK(ev->element.srq == srq);
        ibv_srq_attr q{};
        REQUIRE(ibv_query_srq(srq, &q) == 0);
        CHECK(q.srq_limit == 0);  // the event disarmed it
        send_one();  // 2 left: not again until re-armed
        CHECK(async_quiet(peer.ctx, 200));
    }
    CHECK(ibv_destroy_srq(srq) == 0);
}

TEST_CASE("CQ_ERR: a CQ overrun, on that CQ; the CQ can still be destroyed", "[events][async][cq]") {
    Device dev, peer(Device::kPeer);
    ibv_cq* small = ibv_create_cq(dev.ctx, 1, nullptr, nullptr, 0);
    ibv_cq* rcq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
    REQUIRE(small);
    REQUIRE(rcq);
    Qp b(peer);
    ibv_qp* a = make_qp(dev, small, rcq);
    connect_rc(a, peer.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a->qp_num);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    const int n = small->cqe + 4;
    for (int i = 0; i < n; ++i) REQUIRE(post_recv(b.qp, i, {sge(rbuf, 0, 64)}) == 0);
    for (int i = 0; i < n; ++i) REQUIRE(post_send(a, send_wr(i), {sge(buf, 1024, 8)}) == 0);
    auto ev = wait_async(dev.ctx, IBV_EVENT_CQ_ERR);
    REQUIRE(ev);
    CHECK(ev->element.cq == small);
    CHECK(ibv_destroy_qp(a) == 0);
    CHECK(ibv_destroy_cq(small) == 0);
    CHECK(ibv_destroy_cq(rcq) == 0);
}

TEST_CASE("an async event of a QP destroyed before it was read is skipped", "[events][async]") {
    Device dev, peer(Device::kPeer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    Qp a(dev);
    ibv_cq* cq = ibv_create_cq(peer.ctx, 16, nullptr, nullptr, 0);
    REQUIRE(cq);
    ibv_qp* b = make_qp(peer, cq, cq);
    connect_rc(a.qp, peer.lid, b->qp_num);
    to_rtr(b, dev.lid, a.qpn());
    REQUIRE(post_recv(b, 1, {sge(rbuf, 0, 64)}) == 0);
    REQUIRE(post_send(a.qp, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
    REQUIRE(readable(peer.ctx->async_fd, 2000));  // COMM_EST for b is in the pipe, unread
    REQUIRE(ibv_destroy_qp(b) == 0);              // nothing handed out: destroy does not wait
    CHECK(readable(peer.ctx->async_fd, 0));       // the record is still there...
    int fl = fcntl(peer.ctx->async_fd, F_GETFL);
    REQUIRE(fcntl(peer.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
    ibv_async_event ev{};
    errno = 0;
    CHECK(ibv_get_async_event(peer.ctx, &ev) == -1);  // ...but it is not handed out
    CHECK(errno == EAGAIN);
    REQUIRE(fcntl(peer.ctx->async_fd, F_SETFL, fl) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
}

// ---------------------------------------------------------------------------
// Completion channels
// ---------------------------------------------------------------------------

TEST_CASE("a completion channel wakes once per arming, with the CQ and its cq_context", "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    REQUIRE(post_recv(p.b, 1, {sge(rbuf, 0, 64)}) == 0);
    REQUIRE(post_recv(p.b, 2, {sge(rbuf, 64, 64)}) == 0);
    // Not armed: a completion raises nothing.
    REQUIRE(post_send(p.a, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(poll_one(p.b_rcq));
    CHECK(!readable(p.chan_b->fd, 200));
    // Armed (twice: still one event).
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    REQUIRE(post_send(p.a, send_wr(2), {sge(buf, 1024, 8)}) == 0);
    void* c = nullptr;
    CHECK(get_cq_event(p.chan_b, 2000, &c) == p.b_rcq);
    CHECK(c == &p.tag_b_rcq);
    CHECK(!readable(p.chan_b->fd, 200));
    auto wc = poll_one(p.b_rcq);
    REQUIRE(wc);
    CHECK(wc->wr_id == 2);
    // The send CQ of a was never armed: its channel stayed quiet.
    CHECK(!readable(p.chan_a->fd, 0));
}

TEST_CASE("solicited_only: only solicited receives and error completions wake", "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    for (int i = 0; i < 4; ++i) REQUIRE(post_recv(p.b, i, {sge(rbuf, i * 64, 64)}) == 0);
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 1) == 0);
    REQUIRE(post_send(p.a, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(poll_one(p.a_scq)->status == IBV_WC_SUCCESS);
    CHECK(!readable(p.chan_b->fd, 300));  // an unsolicited receive: no wake
    REQUIRE(post_send(p.a, send_wr(2, IBV_WR_SEND, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED),
                      {sge(buf, 1024, 8)}) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto w1 = poll_one(p.b_rcq), w2 = poll_one(p.b_rcq);
    REQUIRE((w1 && w2));
    CHECK(w1->wr_id == 0);
    CHECK(w2->wr_id == 1);
    // An error completion wakes a solicited-only arming too: b to ERR
    // flushes its two remaining receives.
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 1) == 0);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(p.b, &attr, IBV_QP_STATE) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto f = poll_one(p.b_rcq);
    REQUIRE(f);
    CHECK(f->status == IBV_WC_WR_FLUSH_ERR);
}

TEST_CASE("RDMA WRITE with immediate data wakes the responder's receive CQ; a plain WRITE does not",
          "[events][channel][imm]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer src(dev.pd, 4096, kAll), dst(peer.pd, 4096, kAll);
    std::memcpy(src.data, "immediate", 10);
    REQUIRE(post_recv(p.b, 7, {sge(dst, 2048, 16)}) == 0);
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    ibv_send_wr wr = send_wr(1, IBV_WR_RDMA_WRITE);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.mr->rkey;
    REQUIRE(post_send(p.a, wr, {sge(src, 0, 10)}) == 0);
    REQUIRE(poll_one(p.a_scq)->status == IBV_WC_SUCCESS);
    CHECK(!readable(p.chan_b->fd, 200));
    wr = send_wr(2, IBV_WR_RDMA_WRITE_WITH_IMM);
    wr.imm_data = htonl(0x1234abcd);
    wr.wr.rdma.remote_addr = dst.addr(100);
    wr.wr.rdma.rkey = dst.mr->rkey;
    REQUIRE(post_send(p.a, wr, {sge(src, 0, 10)}) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto w = poll_one(p.b_rcq);
    REQUIRE(w);
    CHECK(w->opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(w->wr_id == 7);
    CHECK(ntohl(w->imm_data) == 0x1234abcd);
    CHECK(std::memcmp(dst.data + 100, "immediate", 10) == 0);
}

TEST_CASE("several CQs on one channel: each event names its CQ", "[events][channel]") {
    Device dev, peer(Device::kPeer);
    // The channel, its CQs and the receivers on the peer device.
    ibv_comp_channel* ch = ibv_create_comp_channel(peer.ctx);
    REQUIRE(ch);
    int tags[3];
    ibv_cq* cqs[3];
    for (int i = 0; i < 3; ++i) {
        cqs[i] = ibv_create_cq(peer.ctx, 16, &tags[i], ch, 0);
        REQUIRE(cqs[i]);
    }
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    {
        // Three receivers, each on its own CQ of the shared channel.
        Qp s(dev);
        ibv_qp* r[3];
        for (int i = 0; i < 3; ++i) r[i] = make_qp(peer, cqs[i], cqs[i]);
        std::set<ibv_cq*> woke;
        for (int i = 0; i < 3; ++i) {
            connect_rc(r[i], dev.lid, s.qpn());
            REQUIRE(post_recv(r[i], i, {sge(rbuf, i * 64, 64)}) == 0);
            REQUIRE(ibv_req_notify_cq(cqs[i], 0) == 0);
        }
        // One sender QP reconnected to each receiver in turn.
        for (int i = 0; i < 3; ++i) {
            ibv_qp_attr a{};
            a.qp_state = IBV_QPS_RESET;
            REQUIRE(ibv_modify_qp(s.qp, &a, IBV_QP_STATE) == 0);
            connect_rc(s.qp, peer.lid, r[i]->qp_num);
            REQUIRE(post_send(s.qp, send_wr(i), {sge(buf, 1024, 8)}) == 0);
            REQUIRE(poll_one(s.send_cq)->status == IBV_WC_SUCCESS);
        }
        for (int i = 0; i < 3; ++i) {
            void* c = nullptr;
            ibv_cq* cq = get_cq_event(ch, 2000, &c);
            REQUIRE(cq);
            int idx = int(static_cast<int*>(c) - tags);
            REQUIRE((idx >= 0 && idx < 3));
            CHECK(cq == cqs[idx]);
            woke.insert(cq);
        }
        CHECK(woke.size() == 3);
        CHECK(!readable(ch->fd, 200));
        for (ibv_qp* q : r) ibv_destroy_qp(q);
    }
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY);  // CQs still use it
    for (ibv_cq* c : cqs) CHECK(ibv_destroy_cq(c) == 0);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("no lost wake-up: arming a CQ that holds unpolled completions added while it was not armed",
          "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    for (int i = 0; i < 8; ++i) REQUIRE(post_recv(p.b, i, {sge(rbuf, i * 64, 64)}) == 0);
    // Open MPI's openib connection manager polls its CQ until empty and then
    // arms it without polling again; completions that came in between must
    // wake it, as on an HCA, which arms relative to the consumer index.
    REQUIRE(post_send(p.a, send_wr(0), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(post_send(p.a, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(poll_one(p.a_scq));
    REQUIRE(poll_one(p.a_scq));
    CHECK(!readable(p.chan_b->fd, 100));  // not armed: nothing yet
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    CHECK(!readable(p.chan_b->fd, 200));  // one event for the arming
    std::vector<uint64_t> ids;
    while (auto w = poll_one(p.b_rcq, 100)) ids.push_back(w->wr_id);
    CHECK(ids == std::vector<uint64_t>{0, 1});
    // Polled before the arming: nothing is left to wake for.
    REQUIRE(post_send(p.a, send_wr(2), {sge(buf, 1024, 8)}) == 0);
    auto w2 = poll_one(p.b_rcq);
    REQUIRE(w2);
    CHECK(w2->wr_id == 2);
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    CHECK(!readable(p.chan_b->fd, 200));
    // A completion added after the arming wakes the channel.
    REQUIRE(post_send(p.a, send_wr(3), {sge(buf, 1024, 8)}) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto w3 = poll_one(p.b_rcq);
    REQUIRE(w3);
    CHECK(w3->wr_id == 3);
}

TEST_CASE("solicited_only: an arming that finds an unpolled plain receive stays quiet, a solicited one wakes it",
          "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    for (int i = 4; i < 6; ++i) REQUIRE(post_recv(p.b, i, {sge(rbuf, i * 64, 64)}) == 0);
    // An unpolled plain receive added while not armed does not wake a
    // solicited-only arming, an arming for any completion then does, and
    // so does an unpolled solicited receive a solicited-only one.
    REQUIRE(post_send(p.a, send_wr(4), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(poll_one(p.a_scq));
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 1) == 0);
    CHECK(!readable(p.chan_b->fd, 200));
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto w4 = poll_one(p.b_rcq);
    REQUIRE(w4);
    CHECK(w4->wr_id == 4);
    REQUIRE(post_send(p.a, send_wr(5, IBV_WR_SEND, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED), {sge(buf, 1024, 8)}) ==
            0);
    REQUIRE(poll_one(p.a_scq));
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 1) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto w5 = poll_one(p.b_rcq);
    REQUIRE(w5);
    CHECK(w5->wr_id == 5);
}

TEST_CASE("a completion that raised its event raises no second one when the CQ is armed before it is polled",
          "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    for (int i = 0; i < 4; ++i) REQUIRE(post_recv(p.b, i, {sge(rbuf, i * 64, 64)}) == 0);
    // The loop of ibv_get_cq_event(3) and of perftest -e: get the event,
    // ack, arm again, then poll. The completion polled after that arming
    // already woke the consumer: an event for it would be spurious.
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    REQUIRE(post_send(p.a, send_wr(0), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(get_cq_event(p.chan_b) == p.b_rcq);  // acknowledged
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    CHECK(!readable(p.chan_b->fd, 200));
    auto w0 = poll_one(p.b_rcq);
    REQUIRE(w0);
    CHECK(w0->wr_id == 0);
    REQUIRE(post_send(p.a, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto w1 = poll_one(p.b_rcq);
    REQUIRE(w1);
    CHECK(w1->wr_id == 1);
}

TEST_CASE("a completion that lands on an armed CQ raises its event even when polled before the event is read",
          "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    for (int i = 0; i < 2; ++i) REQUIRE(post_recv(p.b, i, {sge(rbuf, i * 64, 64)}) == 0);
    // As on an HCA, which raises the event when the completion is written
    // to the armed CQ. perftest -e waits for one event per completion on a
    // channel its send and receive CQs share: with the event of a completion
    // it polled early missing, it waits for ever (ib_send_lat -e between
    // VMs, whose events a thread of the process raises when it looks).
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    REQUIRE(post_send(p.a, send_wr(0), {sge(buf, 1024, 8)}) == 0);
    auto w0 = poll_one(p.b_rcq);
    REQUIRE(w0);
    CHECK(w0->wr_id == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    CHECK(!readable(p.chan_b->fd, 200));  // one event for the arming
    // Polled, event read: the next arming waits for a new completion.
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    CHECK(!readable(p.chan_b->fd, 200));
    REQUIRE(post_send(p.a, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto w1 = poll_one(p.b_rcq);
    REQUIRE(w1);
    CHECK(w1->wr_id == 1);
}

TEST_CASE("completions that came before their event: the arming after it wakes for the ones still unpolled",
          "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    for (int i = 0; i < 4; ++i) REQUIRE(post_recv(p.b, i, {sge(rbuf, i * 64, 64)}) == 0);
    // perftest -e polls once per event. Two completions in the CQ before
    // the consumer reads the event: the first raised it, the second found
    // the arming used; the next arming must wake for the second, or a
    // program that polls once per event waits for ever (ib_send_lat -e
    // between two VMs did, where a thread raises the events in batches).
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    REQUIRE(post_send(p.a, send_wr(0), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(post_send(p.a, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(poll_one(p.a_scq));
    REQUIRE(poll_one(p.a_scq));  // both delivered
    REQUIRE(get_cq_event(p.chan_b) == p.b_rcq);
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    auto w0 = poll_one(p.b_rcq);
    REQUIRE(w0);
    CHECK(w0->wr_id == 0);
    REQUIRE(get_cq_event(p.chan_b) == p.b_rcq);
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    auto w1 = poll_one(p.b_rcq);
    REQUIRE(w1);
    CHECK(w1->wr_id == 1);
    // All polled: the last arming waits for a new completion.
    CHECK(!readable(p.chan_b->fd, 200));
    REQUIRE(post_send(p.a, send_wr(2), {sge(buf, 1024, 8)}) == 0);
    CHECK(get_cq_event(p.chan_b) == p.b_rcq);
    auto w2 = poll_one(p.b_rcq);
    REQUIRE(w2);
    CHECK(w2->wr_id == 2);
}

TEST_CASE("no lost wake-up: an event-driven ping-pong of 3000 round trips never stalls", "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer abuf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    constexpr int kRounds = 3000;
    std::atomic<bool> stalled{false};
    // What stopped a side first (for the report): its name, the step, the
    // round and the status of a failed completion.
    std::mutex why_mu;
    std::string why;
    auto stall = [&](const char* side_name, const char* step, int round, int status = 0) {
        std::lock_guard lock(why_mu);
        if (why.empty())
            why = std::string(side_name) + ": " + step + " at round " + std::to_string(round) +
                  (status ? std::string(" (") + ibv_wc_status_str(ibv_wc_status(status)) + ")" : "");
        stalled = true;
    };
    // The consumer loop of ibv_get_cq_event(3): arm, poll until empty, and
    // only then sleep on the channel (2 s: a lost wake-up, not slowness).
    // Each side receives into and sends from a buffer of its own device.
    auto side = [&](ibv_qp* qp, ibv_cq* rcq, ibv_cq* scq, ibv_comp_channel* ch, bool starts) {
        const char* name = starts ? "a" : "b";
        Buffer& buf = starts ? abuf : rbuf;
        for (int i = 0; i < 16; ++i)
            if (post_recv(qp, i, {sge(buf, 0, 64)})) stall(name, "post_recv", 0);
        if (ibv_req_notify_cq(rcq, 0)) stall(name, "ibv_req_notify_cq", 0);
        int received = 0;
        auto send = [&] {
            if (post_send(qp, send_wr(1, IBV_WR_SEND, 0), {sge(buf, 1024, 8)})) stall(name, "post_send", received);
        };
        if (starts) send();
        while (received < kRounds && !stalled) {
            ibv_wc wc[8];
            int n = ibv_poll_cq(rcq, 8, wc);
            if (n < 0) {
                stall(name, "ibv_poll_cq", received);
                break;
            }
            for (int i = 0; i < n; ++i) {
                if (wc[i].status != IBV_WC_SUCCESS) {
                    // The QP went to error: an error completion of its
                    // (unsignaled) sends says why.
                    ibv_wc sw{};
                    bool send_err = ibv_poll_cq(scq, 1, &sw) == 1 && sw.status != IBV_WC_SUCCESS;
                    stall(name, send_err ? "a failed receive after a failed send" : "a failed receive", received,
                          send_err ? sw.status : wc[i].status);
                }
                ++received;
                post_recv(qp, 0, {sge(buf, 0, 64)});
                if (received < kRounds || !starts) send();
            }
            if (n > 0) continue;
            ibv_cq* cq = get_cq_event(ch, 2000);
            if (cq != rcq) {
                // A lost wake-up, or a message that never arrived: tell
                // them apart by polling once more.
                stall(name, ibv_poll_cq(rcq, 1, wc) > 0 ? "no wake-up (a completion was there)"
                                                        : "no completion within 2 s",
                      received);
                break;
            }
            if (ibv_req_notify_cq(rcq, 0)) stall(name, "ibv_req_notify_cq", received);
        }
    };
    std::thread tb(side, p.b, p.b_rcq, p.b_scq, p.chan_b, false);
    side(p.a, p.a_rcq, p.a_scq, p.chan_a, true);
    tb.join();
    INFO(why);
    CHECK_FALSE(stalled);
}

TEST_CASE("the channel fd works with poll, epoll and O_NONBLOCK", "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    REQUIRE(ep >= 0);
    epoll_event ee{};
    ee.events = EPOLLIN;
    ee.data.u64 = 42;
    REQUIRE(epoll_ctl(ep, EPOLL_CTL_ADD, p.chan_b->fd, &ee) == 0);
    epoll_event out{};
    CHECK(epoll_wait(ep, &out, 1, 100) == 0);
    int fl = fcntl(p.chan_b->fd, F_GETFL);
    REQUIRE(fcntl(p.chan_b->fd, F_SETFL, fl | O_NONBLOCK) == 0);
    ibv_cq* cq = nullptr;
    void* c = nullptr;
    errno = 0;
    CHECK(ibv_get_cq_event(p.chan_b, &cq, &c) == -1);
    CHECK(errno == EAGAIN);

    REQUIRE(post_recv(p.b, 1, {sge(rbuf, 0, 64)}) == 0);
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    REQUIRE(post_send(p.a, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(epoll_wait(ep, &out, 1, 2000) == 1);
    CHECK(out.data.u64 == 42);
    CHECK((out.events & EPOLLIN));
    pollfd pf{p.chan_b->fd, POLLIN, 0};
    CHECK(poll(&pf, 1, 0) == 1);
    REQUIRE(ibv_get_cq_event(p.chan_b, &cq, &c) == 0);
    CHECK(cq == p.b_rcq);
    ibv_ack_cq_events(cq, 1);
    CHECK(poll(&pf, 1, 0) == 0);
    CHECK(epoll_wait(ep, &out, 1, 0) == 0);
    REQUIRE(fcntl(p.chan_b->fd, F_SETFL, fl) == 0);
    close(ep);
}

TEST_CASE("ibv_get_cq_event looks for an event briefly and then sleeps until it comes", "[events][channel]") {
    // The provider looks for a record for VRDMA_EVENT_SPIN_US (20 us)
    // before it sleeps in read() (protocol.md "Completion channels"): an
    // event that comes 300 ms later still wakes the waiter, which spent
    // that time asleep, not spinning.
    Device dev, peer(Device::kPeer);
    ChannelPair p(dev, peer);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    REQUIRE(post_recv(p.b, 1, {sge(rbuf, 0, 64)}) == 0);
    REQUIRE(ibv_req_notify_cq(p.b_rcq, 0) == 0);
    std::atomic<int> rc{-1};
    ibv_cq* got = nullptr;
    double cpu_ms = 0;
    std::thread waiter([&] {
        void* c = nullptr;
        rc = ibv_get_cq_event(p.chan_b, &got, &c);
        timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        cpu_ms = double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(rc.load() == -1);  // still waiting
    REQUIRE(post_send(p.a, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    waiter.join();
    REQUIRE(rc.load() == 0);
    CHECK(got == p.b_rcq);
    ibv_ack_cq_events(got, 1);
    CHECK(cpu_ms < 100);  // asleep for most of the 300 ms
}

TEST_CASE("ibv_destroy_cq waits for unacknowledged events, then returns", "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ibv_comp_channel* ch = ibv_create_comp_channel(peer.ctx);
    REQUIRE(ch);
    ibv_cq* cq = ibv_create_cq(peer.ctx, 16, nullptr, ch, 0);
    REQUIRE(cq);
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    Qp s(dev);
    ibv_qp* r = make_qp(peer, cq, cq);
    connect_rc(s.qp, peer.lid, r->qp_num);
    connect_rc(r, dev.lid, s.qpn());
    REQUIRE(post_recv(r, 1, {sge(rbuf, 0, 64)}) == 0);
    REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
    REQUIRE(post_send(s.qp, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(readable(ch->fd, 2000));
    ibv_cq* got = nullptr;
    void* c = nullptr;
    REQUIRE(ibv_get_cq_event(ch, &got, &c) == 0);
    REQUIRE(got == cq);
    REQUIRE(ibv_destroy_qp(r) == 0);
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
    std::atomic<int> rc{-1};
    std::atomic<bool> done{false};
    std::thread t([&] {
        rc = ibv_destroy_cq(cq);
        done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK_FALSE(done.load());  // one event handed out, not acknowledged
    ibv_ack_cq_events(got, 1);
    t.join();
    CHECK(rc.load() == 0);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("an event of a CQ destroyed before it was read is skipped", "[events][channel]") {
    Device dev, peer(Device::kPeer);
    ibv_comp_channel* ch = ibv_create_comp_channel(peer.ctx);
    REQUIRE(ch);
    ibv_cq* cq1 = ibv_create_cq(peer.ctx, 16, nullptr, ch, 0);
    ibv_cq* cq2 = ibv_create_cq(peer.ctx, 16, nullptr, ch, 0);
    REQUIRE((cq1 && cq2));
    Buffer buf(dev.pd, 4096, kAll), rbuf(peer.pd, 4096, kAll);
    Qp s(dev);
    ibv_qp* r1 = make_qp(peer, cq1, cq1);
    ibv_qp* r2 = make_qp(peer, cq2, cq2);
    connect_rc(r1, dev.lid, s.qpn());
    connect_rc(r2, dev.lid, s.qpn());
    REQUIRE(post_recv(r1, 1, {sge(rbuf, 0, 64)}) == 0);
    REQUIRE(post_recv(r2, 2, {sge(rbuf, 64, 64)}) == 0);
    REQUIRE(ibv_req_notify_cq(cq1, 0) == 0);
    REQUIRE(ibv_req_notify_cq(cq2, 0) == 0);
    connect_rc(s.qp, peer.lid, r1->qp_num);
    REQUIRE(post_send(s.qp, send_wr(1), {sge(buf, 1024, 8)}) == 0);
    REQUIRE(readable(ch->fd, 2000));  // cq1's record is in the channel, unread
    REQUIRE(ibv_destroy_qp(r1) == 0);
    REQUIRE(ibv_destroy_cq(cq1) == 0);  // nothing handed out: no wait
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    REQUIRE(ibv_modify_qp(s.qp, &a, IBV_QP_STATE) == 0);
    connect_rc(s.qp, peer.lid, r2->qp_num);
    REQUIRE(post_send(s.qp, send_wr(2), {sge(buf, 1024, 8)}) == 0);
    void* c = nullptr;
    CHECK(get_cq_event(ch, 2000, &c) == cq2);
    REQUIRE(ibv_destroy_qp(r2) == 0);
    REQUIRE(ibv_destroy_cq(cq2) == 0);
    REQUIRE(ibv_destroy_comp_channel(ch) == 0);
}

// ---------------------------------------------------------------------------
// The RDMA netlink hiding of the preloaded provider (vrdma-run)
// ---------------------------------------------------------------------------

TEST_CASE("under vrdma-run, NETLINK_RDMA sockets fail with EPROTONOSUPPORT while NETLINK_ROUTE works",
          "[events][netlink]") {
    using SocketFn = int (*)(int, int, int);
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(libc);
    auto libc_socket = reinterpret_cast<SocketFn>(dlsym(libc, "socket"));
    auto active_socket = reinterpret_cast<SocketFn>(dlsym(RTLD_DEFAULT, "socket"));
    REQUIRE(libc_socket);
    // The provider's socket() is the one every library of this process
    // (libibverbs' libnl among them) calls.
    CHECK(active_socket != libc_socket);
    Dl_info info{};
    REQUIRE(dladdr(reinterpret_cast<void*>(active_socket), &info));
    CHECK(std::string(info.dli_fname).find("vrdma") != std::string::npos);

    errno = 0;
    int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA);
    CHECK(s == -1);
    CHECK(errno == EPROTONOSUPPORT);
    if (s >= 0) close(s);
    int r = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    CHECK(r >= 0);
    if (r >= 0) close(r);
    int u = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(u >= 0);
    if (u >= 0) close(u);
    // Whether this kernel has RDMA netlink at all (when it has, the hiding
    // is what keeps libibverbs on SYSFS_PATH).
    int k = libc_socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA);
    if (k >= 0) {
        close(k);
        UNSCOPED_INFO("this kernel has RDMA netlink; the provider hides it");
    }
    dlclose(libc);
}
