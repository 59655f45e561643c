// Extended CQs (ibv_create_cq_ex): the start_poll / next_poll / end_poll
// interface and the read_* fields over the same completion ring as
// ibv_poll_cq, between two guests; and the flags that are refused.
#include <arpa/inet.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>

#include "verbs_fixture.h"

using namespace vt;

namespace {

ibv_cq_ex* make_cq_ex(ibv_context* ctx, uint32_t cqe, uint64_t wc_flags = IBV_WC_STANDARD_FLAGS) {
    ibv_cq_init_attr_ex a{};
    a.cqe = cqe;
    a.wc_flags = wc_flags;
    return ibv_create_cq_ex(ctx, &a);
}

// RC QPs a (on `dev`) and b (on `peer`), connected, each completing
// into its extended CQ.
struct ExPair {
    ExPair(Device& dev, Device& peer, ibv_cq_ex* acq, ibv_cq_ex* bcq) : a(dev, on(acq)), b(peer, on(bcq)) {
        connect_rc(a.qp, peer.lid, b.qpn());
        connect_rc(b.qp, dev.lid, a.qpn());
    }
    static QpOptions on(ibv_cq_ex* cq) {
        QpOptions o;
        o.send_cq = o.recv_cq = ibv_cq_ex_to_cq(cq);
        return o;
    }
    Qp a, b;
};

// What a generic program reads from an extended CQ.
struct ExWc {
    uint64_t wr_id;
    ibv_wc_status status;
    ibv_wc_opcode opcode;
    uint32_t byte_len, qp_num, src_qp, slid;
    unsigned wc_flags;
    uint32_t imm;
    uint8_t sl, dlid_path_bits;
};

ExWc read_current(ibv_cq_ex* cq) {
    ExWc w{};
    w.wr_id = cq->wr_id;
    w.status = cq->status;
    w.opcode = ibv_wc_read_opcode(cq);
    w.byte_len = ibv_wc_read_byte_len(cq);
    w.qp_num = ibv_wc_read_qp_num(cq);
    w.src_qp = ibv_wc_read_src_qp(cq);
    w.slid = ibv_wc_read_slid(cq);
    w.wc_flags = ibv_wc_read_wc_flags(cq);
    w.imm = ntohl(ibv_wc_read_imm_data(cq));
    w.sl = ibv_wc_read_sl(cq);
    w.dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
    return w;
}

// Polls until `n` completions were read in one start/next/end batch or
// across batches, within 2 s.
std::vector<ExWc> poll_ex(ibv_cq_ex* cq, size_t n) {
    std::vector<ExWc> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
        ibv_poll_cq_attr attr{};
        int rc = ibv_start_poll(cq, &attr);
        if (rc == ENOENT) {
            std::this_thread::yield();
            continue;
        }
        REQUIRE(rc == 0);
        do out.push_back(read_current(cq));
        while (out.size() < n && (rc = ibv_next_poll(cq)) == 0);
        ibv_end_poll(cq);
    }
    return out;
}

}  // namespace

TEST_CASE("extended CQ: start/next/end poll reads every field of send and receive completions", "[cq_ex]") {
    Device dev, peer(Device::kPeer);
    ibv_cq_ex* scq = make_cq_ex(dev.ctx, 64);
    ibv_cq_ex* rcq = make_cq_ex(peer.ctx, 64);
    REQUIRE(scq);
    REQUIRE(rcq);
    {
        ExPair pair(dev, peer, scq, rcq);
        Qp& a = pair.a;
        Qp& b = pair.b;
        int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        Buffer src(dev.pd, 4096, all), dst(peer.pd, 4096, all);
        for (size_t i = 0; i < src.size; ++i) src.data[i] = uint8_t(i * 13 + 1);

        // Three receives: a send with immediate, a plain send, a write with immediate.
        for (uint64_t id = 100; id < 103; ++id) REQUIRE(post_recv(b.qp, id, {sge(dst, 0, 2048)}) == 0);
        ibv_send_wr wr{};
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr_id = 1;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.imm_data = htonl(0x01020304);
        REQUIRE(post_send(a.qp, wr, {sge(src, 0, 1500)}) == 0);
        wr.wr_id = 2;
        wr.opcode = IBV_WR_SEND;
        REQUIRE(post_send(a.qp, wr, {sge(src, 0, 700)}) == 0);
        wr.wr_id = 3;
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl(0xa0b0c0d0);
        wr.wr.rdma.remote_addr = dst.addr(2048);
        wr.wr.rdma.rkey = dst.mr->rkey;
        REQUIRE(post_send(a.qp, wr, {sge(src, 100, 512)}) == 0);

        auto s = poll_ex(scq, 3);
        REQUIRE(s.size() == 3);
        const ibv_wc_opcode sops[3] = {IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE};
        for (int i = 0; i < 3; ++i) {
            CHECK(s[i].wr_id == uint64_t(i + 1));
            CHECK(s[i].status == IBV_WC_SUCCESS);
            CHECK(s[i].opcode == sops[i]);
            CHECK(s[i].qp_num == a.qpn());
            CHECK((s[i].wc_flags & IBV_WC_WITH_IMM) == 0);
        }

        auto r = poll_ex(rcq, 3);
        REQUIRE(r.size() == 3);
        CHECK(r[0].wr_id == 100);
        CHECK(r[0].status == IBV_WC_SUCCESS);
        CHECK(r[0].opcode == IBV_WC_RECV);
        CHECK(r[0].byte_len == 1500);
        CHECK((r[0].wc_flags & IBV_WC_WITH_IMM) != 0);
        CHECK(r[0].imm == 0x01020304);
        CHECK(r[1].wr_id == 101);
        CHECK(r[1].opcode == IBV_WC_RECV);
        CHECK(r[1].byte_len == 700);
        CHECK((r[1].wc_flags & IBV_WC_WITH_IMM) == 0);
        CHECK(r[2].wr_id == 102);
        CHECK(r[2].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
        CHECK(r[2].byte_len == 512);
        CHECK(r[2].imm == 0xa0b0c0d0);
        for (auto& w : r) {
            CHECK(w.qp_num == b.qpn());
            CHECK(w.src_qp == a.qpn());
            CHECK(w.slid == dev.lid);
            CHECK(w.sl == 0);
            CHECK(w.dlid_path_bits == 0);
        }
        bool intact = true;
        for (size_t i = 0; i < 700; ++i) intact &= dst.data[i] == src.data[i];
        for (size_t i = 0; i < 512; ++i) intact &= dst.data[2048 + i] == src.data[100 + i];
        CHECK(intact);

        // The ring is empty now, by either interface; ibv_poll_cq works on
        // the same CQ, and arming it works.
        ibv_poll_cq_attr attr{};
        CHECK(ibv_start_poll(rcq, &attr) == ENOENT);
        ibv_wc wc{};
        CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(rcq), 1, &wc) == 0);
        REQUIRE(post_recv(b.qp, 200, {sge(dst, 0, 64)}) == 0);
        wr.wr_id = 4;
        wr.opcode = IBV_WR_SEND;
        REQUIRE(post_send(a.qp, wr, {sge(src, 0, 64)}) == 0);
        auto plain = poll_one(ibv_cq_ex_to_cq(rcq));
        REQUIRE(plain);
        CHECK(plain->wr_id == 200);
        CHECK(plain->byte_len == 64);
        CHECK(poll_ex(scq, 1).size() == 1);
        CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(scq), 0) == 0);
    }
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(scq)) == 0);
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(rcq)) == 0);
}

TEST_CASE("extended CQ: an error completion and end_poll after next_poll ran dry", "[cq_ex]") {
    Device dev, peer(Device::kPeer);
    ibv_cq_ex* cq = make_cq_ex(dev.ctx, 16, IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM);
    REQUIRE(cq);
    QpOptions o;
    o.send_cq = o.recv_cq = ibv_cq_ex_to_cq(cq);
    {
        Qp a(dev, o), b(peer);
        connect_rc(a.qp, peer.lid, b.qpn());
        connect_rc(b.qp, dev.lid, a.qpn());
        Buffer src(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
        ibv_send_wr wr{};
        wr.wr_id = 9;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        // A bad lkey: a local protection error, then the QP is in error.
        REQUIRE(post_send(a.qp, wr, {ibv_sge{src.addr(), 8, src.mr->lkey + 1}}) == 0);
        auto w = poll_ex(cq, 1);
        REQUIRE(w.size() == 1);
        CHECK(w[0].wr_id == 9);
        CHECK(w[0].status == IBV_WC_LOC_PROT_ERR);
        CHECK(w[0].qp_num == a.qpn());
        // A batch that ends with next_poll's ENOENT consumes only what it read.
        REQUIRE(post_recv(a.qp, 10, {sge(src, 0, 8)}) == 0);
        REQUIRE(post_recv(a.qp, 11, {sge(src, 0, 8)}) == 0);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        std::vector<uint64_t> ids;
        while (ids.size() < 2 && std::chrono::steady_clock::now() < deadline) {
            ibv_poll_cq_attr attr{};
            if (ibv_start_poll(cq, &attr) != 0) continue;
            // Arming inside a batch is allowed (and must not wait for end_poll).
            CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 0) == 0);
            do {
                ids.push_back(cq->wr_id);
                CHECK(cq->status == IBV_WC_WR_FLUSH_ERR);
            } while (ibv_next_poll(cq) == 0);
            ibv_end_poll(cq);
        }
        CHECK(ids == std::vector<uint64_t>{10, 11});
        ibv_poll_cq_attr attr{};
        CHECK(ibv_start_poll(cq, &attr) == ENOENT);
    }
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}

TEST_CASE("extended CQ: unsupported completion fields and flags are refused", "[cq_ex][api]") {
    Device dev;
    errno = 0;
    CHECK(make_cq_ex(dev.ctx, 8, IBV_WC_EX_WITH_CVLAN) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    errno = 0;
    CHECK(make_cq_ex(dev.ctx, 8, IBV_WC_EX_WITH_FLOW_TAG) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    ibv_cq_init_attr_ex a{};
    a.cqe = 8;
    a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    a.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
    errno = 0;
    CHECK(ibv_create_cq_ex(dev.ctx, &a) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    a.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;  // a hint: accepted
    ibv_cq_ex* ok = ibv_create_cq_ex(dev.ctx, &a);
    REQUIRE(ok);
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(ok)) == 0);
    a = {};
    a.cqe = 8;
    a.comp_vector = 1;
    errno = 0;
    CHECK(ibv_create_cq_ex(dev.ctx, &a) == nullptr);
    CHECK(errno == EINVAL);
    a.comp_vector = 0;
    a.cqe = 0;
    errno = 0;
    CHECK(ibv_create_cq_ex(dev.ctx, &a) == nullptr);
    CHECK(errno == EINVAL);
}

TEST_CASE("extended CQ on a completion channel: the channel is counted once and freed with the CQ", "[cq_ex]") {
    // UCX destroys its CQs, then their channel, and warns when the channel
    // is still busy (EBUSY): libibverbs counts an extended CQ on its channel
    // itself, as for ibv_create_cq.
    Device dev;
    ibv_comp_channel* ch = ibv_create_comp_channel(dev.ctx);
    REQUIRE(ch);
    ibv_cq_init_attr_ex a{};
    a.cqe = 16;
    a.wc_flags = IBV_WC_STANDARD_FLAGS;
    a.channel = ch;
    int marker = 0;
    a.cq_context = &marker;
    ibv_cq_ex* cq = ibv_create_cq_ex(dev.ctx, &a);
    REQUIRE(cq);
    CHECK(ch->refcnt == 1);
    CHECK(ibv_cq_ex_to_cq(cq)->channel == ch);
    CHECK(ibv_cq_ex_to_cq(cq)->cq_context == &marker);
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY);  // still used
    REQUIRE(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
}

namespace {
uint64_t now_ns(clockid_t clock) {
    timespec ts;
    clock_gettime(clock, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// One completion's stamps, read between start_poll and end_poll.
struct Stamps {
    ibv_wc_status status;
    uint64_t device, wall;
};
Stamps poll_stamps(ibv_cq_ex* cq) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    ibv_poll_cq_attr attr{};
    int rc;
    while ((rc = ibv_start_poll(cq, &attr)) == ENOENT && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
    REQUIRE(rc == 0);
    Stamps s{cq->status, ibv_wc_read_completion_ts(cq), ibv_wc_read_completion_wallclock_ns(cq)};
    ibv_end_poll(cq);
    return s;
}
}  // namespace

TEST_CASE("extended CQ: completions stamped on the device clock and the wall clock; the clock's values",
          "[cq_ex]") {
    Device dev, peer(Device::kPeer);
    ibv_device_attr_ex da{};
    REQUIRE(ibv_query_device_ex(dev.ctx, nullptr, &da) == 0);
    CHECK(da.hca_core_clock == 1000000);  // kHz: the device clock counts nanoseconds
    CHECK(da.completion_timestamp_mask == ~uint64_t(0));

    constexpr uint64_t kFlags = uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    ibv_cq_ex* scq = make_cq_ex(dev.ctx, 8, kFlags);
    ibv_cq_ex* rcq = make_cq_ex(peer.ctx, 8, kFlags);
    REQUIRE(scq);
    REQUIRE(rcq);
    {
        ExPair pair(dev, peer, scq, rcq);
        Qp& a = pair.a;
        Qp& b = pair.b;
        Buffer src(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE), dst(peer.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
        REQUIRE(post_recv(b.qp, 1, {sge(dst, 0, 64)}) == 0);

        const uint64_t mono0 = now_ns(CLOCK_MONOTONIC), wall0 = now_ns(CLOCK_REALTIME);
        ibv_send_wr wr{};
        wr.wr_id = 2;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        REQUIRE(post_send(a.qp, wr, {sge(src, 0, 64)}) == 0);
        const Stamps sent = poll_stamps(scq);
        const Stamps got = poll_stamps(rcq);
        const uint64_t mono1 = now_ns(CLOCK_MONOTONIC), wall1 = now_ns(CLOCK_REALTIME);
        CHECK(sent.status == IBV_WC_SUCCESS);
        CHECK(got.status == IBV_WC_SUCCESS);
        // Each completion was stamped between the post and its poll, on
        // the host's clocks.
        CHECK(sent.device >= mono0);
        CHECK(sent.device <= mono1);
        CHECK(got.device >= mono0);
        CHECK(got.device <= mono1);
        CHECK(sent.wall >= wall0);
        CHECK(sent.wall <= wall1);
        CHECK(got.wall >= wall0);
        CHECK(got.wall <= wall1);
    }
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(scq)) == 0);
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(rcq)) == 0);

    // ibv_query_rt_values_ex reads the same clock (as mlx5: ticks in tv_nsec).
    const uint64_t before = now_ns(CLOCK_MONOTONIC);
    ibv_values_ex v{};
    v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
    REQUIRE(ibv_query_rt_values_ex(dev.ctx, &v) == 0);
    const uint64_t after = now_ns(CLOCK_MONOTONIC);
    CHECK(v.comp_mask == IBV_VALUES_MASK_RAW_CLOCK);
    CHECK(v.raw_clock.tv_sec == 0);
    CHECK(uint64_t(v.raw_clock.tv_nsec) >= before);
    CHECK(uint64_t(v.raw_clock.tv_nsec) <= after);
    v.comp_mask = 1u << 5;  // no such value
    CHECK(ibv_query_rt_values_ex(dev.ctx, &v) == EINVAL);
}
