// RC and UD semantics between two guests of one shim: by the local
// transport (one worker) and through the worker links (two workers).
#include <arpa/inet.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;
using abi::CmdOp;

namespace {

// An RC pair: a's QP connected to b's QP, each with one CQ and a 64 KiB MR.
struct RcPair : TwoGuests {
    uint32_t pd_a, pd_b;
    FakeProvider::CqView cq_a, cq_b;
    FakeProvider::QpView qa, qb;
    FakeProvider::MrInfo ma, mb;
    explicit RcPair(Workers w, uint32_t access_b = kAllAccess, uint8_t rnr_retry = 7,
                    uint32_t mr_access_b = kAllAccess)
        : TwoGuests(w) {
        pd_a = a.pd();
        pd_b = b.pd();
        cq_a = a.cq(64);
        cq_b = b.cq(64);
        qa = a.qp(pd_a, cq_a, cq_a);
        qb = b.qp(pd_b, cq_b, cq_b);
        ma = a.mr(pd_a, 65536, kAllAccess);
        mb = b.mr(pd_b, 65536, mr_access_b);
        a.connect_rc(qa, 2, qb.qpn, kAllAccess, rnr_retry);
        b.connect_rc(qb, 1, qa.qpn, access_b, rnr_retry);
    }
    uint8_t* pa(uint64_t off = 0) { return a.at(ma.addr + off); }
    uint8_t* pb(uint64_t off = 0) { return b.at(mb.addr + off); }
    abi::Sge sa(uint64_t off, uint32_t len) { return abi::Sge{ma.addr + off, len, ma.lkey}; }
    abi::Sge sb(uint64_t off, uint32_t len) { return abi::Sge{mb.addr + off, len, mb.lkey}; }
};

}  // namespace

TEST_CASE("RC send with several SGEs and immediate data", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    RcPair t(workers);
    std::memcpy(t.pa(0), "hello ", 6);
    std::memcpy(t.pa(100), "vrdma ", 6);
    std::memcpy(t.pa(200), "world", 5);
    t.b.post_recv(t.qb.rq, 77, {t.sb(1000, 4), t.sb(2000, 100)});
    auto w = send_wqe(5, IBV_WR_SEND_WITH_IMM);
    w.imm_data = htonl(0xabcdef01);
    t.a.post_send(t.qa.sq, w, {t.sa(0, 6), t.sa(100, 6), t.sa(200, 5)});
    t.run();
    CHECK(std::memcmp(t.pb(1000), "hell", 4) == 0);
    CHECK(std::memcmp(t.pb(2000), "o vrdma world", 13) == 0);
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].wr_id == 77);
    CHECK(rc[0].status == IBV_WC_SUCCESS);
    CHECK(rc[0].opcode == IBV_WC_RECV);
    CHECK(rc[0].byte_len == 17);
    CHECK(rc[0].wc_flags == IBV_WC_WITH_IMM);
    CHECK(rc[0].imm_data == htonl(0xabcdef01));
    CHECK(rc[0].qp_num == t.qb.qpn);
    CHECK(rc[0].src_qp == t.qa.qpn);
    CHECK(rc[0].slid == 1);
    CHECK(rc[0].sl == 3);
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].wr_id == 5);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[0].opcode == IBV_WC_SEND);
    CHECK(sc[0].qp_num == t.qa.qpn);
    CHECK(t.a.consumer_of(t.qa.sq) == 1);
    CHECK(t.b.consumer_of(t.qb.rq) == 1);
}

TEST_CASE("RC inline send and unsignaled completions", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    RcPair t(workers);
    t.b.post_recv(t.qb.rq, 1, {t.sb(0, 64)});
    t.b.post_recv(t.qb.rq, 2, {t.sb(64, 64)});
    auto w = send_wqe(10, IBV_WR_SEND, IBV_SEND_INLINE);  // unsignaled
    w.inline_len = 3;
    t.a.post_send(t.qa.sq, w, {}, "abc");
    t.a.post_send(t.qa.sq, send_wqe(11, IBV_WR_SEND), {t.sa(0, 0)});  // zero-length, signaled
    t.run();
    CHECK(std::memcmp(t.pb(0), "abc", 3) == 0);
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].wr_id == 11);
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 2);
    CHECK(rc[0].byte_len == 3);
    CHECK(rc[1].byte_len == 0);
    CHECK(rc[1].wc_flags == 0);
}

TEST_CASE("RDMA write, write with immediate and read", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    RcPair t(workers);
    std::memcpy(t.pa(0), "0123456789", 10);
    auto w = send_wqe(1, IBV_WR_RDMA_WRITE);
    w.remote_addr = t.mb.addr + 500;
    w.rkey = t.mb.rkey;
    t.a.post_send(t.qa.sq, w, {t.sa(0, 4), t.sa(6, 4)});
    t.run();
    CHECK(std::memcmp(t.pb(500), "01236789", 8) == 0);
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].opcode == IBV_WC_RDMA_WRITE);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(t.b.poll(t.cq_b).empty());  // plain writes are invisible to the responder

    t.b.post_recv(t.qb.rq, 42, {});
    w = send_wqe(2, IBV_WR_RDMA_WRITE_WITH_IMM);
    w.remote_addr = t.mb.addr + 600;
    w.rkey = t.mb.rkey;
    w.imm_data = htonl(7);
    t.a.post_send(t.qa.sq, w, {t.sa(0, 10)});
    t.run();
    CHECK(std::memcmp(t.pb(600), "0123456789", 10) == 0);
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].wr_id == 42);
    CHECK(rc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(rc[0].byte_len == 10);
    CHECK(rc[0].imm_data == htonl(7));
    CHECK(rc[0].wc_flags == IBV_WC_WITH_IMM);

    std::memcpy(t.pb(4000), "remote-data", 11);
    w = send_wqe(3, IBV_WR_RDMA_READ);
    w.remote_addr = t.mb.addr + 4000;
    w.rkey = t.mb.rkey;
    t.a.post_send(t.qa.sq, w, {t.sa(8000, 6), t.sa(9000, 5)});
    t.run();
    CHECK(std::memcmp(t.pa(8000), "remote", 6) == 0);
    CHECK(std::memcmp(t.pa(9000), "-data", 5) == 0);
    sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 2);
    CHECK(sc[1].opcode == IBV_WC_RDMA_READ);
    CHECK(sc[1].byte_len == 11);
}

TEST_CASE("atomics fetch-and-add and compare-and-swap", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    RcPair t(workers);
    uint64_t v = 100;
    std::memcpy(t.pb(64), &v, 8);
    auto w = send_wqe(1, IBV_WR_ATOMIC_FETCH_AND_ADD);
    w.remote_addr = t.mb.addr + 64;
    w.rkey = t.mb.rkey;
    w.compare_add = 5;
    t.a.post_send(t.qa.sq, w, {t.sa(0, 8)});
    w = send_wqe(2, IBV_WR_ATOMIC_CMP_AND_SWP);
    w.remote_addr = t.mb.addr + 64;
    w.rkey = t.mb.rkey;
    w.compare_add = 105;
    w.swap = 7;
    t.a.post_send(t.qa.sq, w, {t.sa(8, 8)});
    w.wr_id = 3;  // compare fails now
    t.a.post_send(t.qa.sq, w, {t.sa(16, 8)});
    t.run();
    uint64_t r0, r1, r2, now;
    std::memcpy(&r0, t.pa(0), 8);
    std::memcpy(&r1, t.pa(8), 8);
    std::memcpy(&r2, t.pa(16), 8);
    std::memcpy(&now, t.pb(64), 8);
    CHECK(r0 == 100);
    CHECK(r1 == 105);
    CHECK(r2 == 7);
    CHECK(now == 7);
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 3);
    CHECK(sc[0].opcode == IBV_WC_FETCH_ADD);
    CHECK(sc[1].opcode == IBV_WC_COMP_SWAP);
    for (auto& c : sc) CHECK(c.status == IBV_WC_SUCCESS);

    // Misaligned target: invalid request, both QPs to error.
    w = send_wqe(4, IBV_WR_ATOMIC_FETCH_AND_ADD);
    w.remote_addr = t.mb.addr + 65;
    w.rkey = t.mb.rkey;
    t.a.post_send(t.qa.sq, w, {t.sa(0, 8)});
    t.run();
    sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_REM_INV_REQ_ERR);
    CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_ERR);
}

TEST_CASE("remote access violations: REM_ACCESS_ERR and both QPs in error", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    SECTION("bad rkey") {
        RcPair t(workers);
        auto w = send_wqe(1, IBV_WR_RDMA_WRITE);
        w.remote_addr = t.mb.addr;
        w.rkey = t.mb.rkey + 1;
        t.a.post_send(t.qa.sq, w, {t.sa(0, 8)});
        t.b.post_recv(t.qb.rq, 9, {t.sb(0, 8)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_ACCESS_ERR);
        CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_ERR);
        CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_ERR);
        auto rc = t.b.poll(t.cq_b);  // the posted receive is flushed
        REQUIRE(rc.size() == 1);
        CHECK(rc[0].status == IBV_WC_WR_FLUSH_ERR);
        CHECK(rc[0].wr_id == 9);
    }
    SECTION("range outside the MR, including wrap-around") {
        RcPair t(workers);
        auto w = send_wqe(1, IBV_WR_RDMA_READ);
        w.remote_addr = t.mb.addr + 65536 - 4;
        w.rkey = t.mb.rkey;
        t.a.post_send(t.qa.sq, w, {t.sa(0, 8)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_ACCESS_ERR);
        RcPair u(workers);
        w.remote_addr = ~0ull - 2;
        w.rkey = u.mb.rkey;
        u.a.post_send(u.qa.sq, w, {u.sa(0, 8)});
        u.run();
        sc = u.a.poll(u.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_ACCESS_ERR);
    }
    SECTION("MR without remote write") {
        RcPair t(workers, kAllAccess, 7, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        auto w = send_wqe(1, IBV_WR_RDMA_WRITE);
        w.remote_addr = t.mb.addr;
        w.rkey = t.mb.rkey;
        t.a.post_send(t.qa.sq, w, {t.sa(0, 8)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_ACCESS_ERR);
    }
    SECTION("QP without remote read access") {
        RcPair t(workers, IBV_ACCESS_REMOTE_WRITE);
        auto w = send_wqe(1, IBV_WR_RDMA_READ);
        w.remote_addr = t.mb.addr;
        w.rkey = t.mb.rkey;
        t.a.post_send(t.qa.sq, w, {t.sa(0, 8)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_ACCESS_ERR);
    }
    SECTION("the requester's own MR is not a valid rkey at the responder") {
        RcPair t(workers);
        auto w = send_wqe(1, IBV_WR_RDMA_WRITE);
        w.remote_addr = t.ma.addr;
        w.rkey = t.ma.rkey;  // a key of guest a, presented to guest b
        t.a.post_send(t.qa.sq, w, {t.sa(0, 8)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_ACCESS_ERR);
    }
}

TEST_CASE("local errors: bad lkey, too many SGEs, bad opcode", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    SECTION("bad lkey: LOC_PROT_ERR, later WQEs flushed") {
        RcPair t(workers);
        t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {abi::Sge{t.ma.addr, 8, t.ma.lkey + 7}});
        t.a.post_send(t.qa.sq, send_wqe(2, IBV_WR_SEND, 0), {t.sa(0, 8)});  // unsignaled, still flushed
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 2);
        CHECK(sc[0].wr_id == 1);
        CHECK(sc[0].status == IBV_WC_LOC_PROT_ERR);
        CHECK(sc[1].wr_id == 2);
        CHECK(sc[1].status == IBV_WC_WR_FLUSH_ERR);
        CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_ERR);
        CHECK(t.a.consumer_of(t.qa.sq) == 2);
        CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_RTS);
    }
    SECTION("SGE beyond its MR") {
        RcPair t(workers);
        t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(65530, 16)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_LOC_PROT_ERR);
    }
    SECTION("num_sge over the QP's limit") {
        RcPair t(workers);
        auto w = send_wqe(1, IBV_WR_SEND);
        w.num_sge = 5;  // QP has max_send_sge 4
        t.a.post_send(t.qa.sq, w, {t.sa(0, 1), t.sa(1, 1), t.sa(2, 1), t.sa(3, 1), t.sa(4, 1)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_LOC_QP_OP_ERR);
    }
    SECTION("inline over the limit, opcode not allowed") {
        RcPair t(workers);
        auto w = send_wqe(1, IBV_WR_SEND, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
        w.inline_len = 900;  // QP max_inline 256
        static const char data[1024] = {};
        t.a.post_send(t.qa.sq, w, {}, data);
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_LOC_LEN_ERR);
        RcPair u(workers);
        u.a.post_send(u.qa.sq, send_wqe(1, IBV_WR_TSO), {});
        u.a.post_send(u.qa.sq, send_wqe(2, 99), {});
        u.run();
        sc = u.a.poll(u.cq_a);
        REQUIRE(sc.size() == 2);
        CHECK(sc[0].status == IBV_WC_LOC_QP_OP_ERR);
        CHECK(sc[1].status == IBV_WC_WR_FLUSH_ERR);
        // The shim's own rendezvous requests are not a guest's to send.
        for (uint32_t op : {kTmRndvRead, kTmRndvFin}) {
            RcPair v(workers);
            v.b.post_recv(v.qb.rq, 5, {v.sb(0, 64)});
            v.a.post_send(v.qa.sq, send_wqe(1, op), {v.sa(0, 32)});
            v.run();
            sc = v.a.poll(v.cq_a);
            REQUIRE(sc.size() == 1);
            CHECK(sc[0].status == IBV_WC_LOC_QP_OP_ERR);
            CHECK(v.b.poll(v.cq_b).empty());
        }
    }
    SECTION("receive buffer too small") {
        RcPair t(workers);
        t.b.post_recv(t.qb.rq, 5, {t.sb(0, 4)});
        t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(0, 8)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_INV_REQ_ERR);
        auto rc = t.b.poll(t.cq_b);
        REQUIRE(rc.size() == 1);
        CHECK(rc[0].status == IBV_WC_LOC_LEN_ERR);
        CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_ERR);
    }
    SECTION("an invalid send queue producer index puts the QP in error") {
        RcPair t(workers);
        reinterpret_cast<abi::RingHeader*>(t.a.at(t.qa.sq.ring))->producer.store(1000);
        t.a.announce(t.qa.sq);
        t.run();
        CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_ERR);
    }
}

TEST_CASE("RNR: rnr_retry 0 fails, rnr_retry 7 waits for a receive", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    SECTION("rnr_retry 0") {
        RcPair t(workers, kAllAccess, 0);
        t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(0, 8)});
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
        CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_ERR);
    }
    SECTION("rnr_retry 2 gives up after two timer periods") {
        RcPair t(workers, kAllAccess, 2);
        t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(0, 8)});
        t.run();
        CHECK(t.a.poll(t.cq_a).empty());
        CHECK(t.eng.next_deadline_ns() > g_fake_now);
        // Three RNR NAKs: the first try and two retries, one timer apart.
        g_fake_now += 10'000'000;
        t.run();
        CHECK(t.a.poll(t.cq_a).empty());
        g_fake_now += 10'000'000;
        t.run();
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
    }
    SECTION("rnr_retry 7") {
        RcPair t(workers, kAllAccess, 7);
        std::memcpy(t.pa(0), "late", 4);
        t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(0, 4)});
        t.a.post_send(t.qa.sq, send_wqe(2, IBV_WR_SEND), {t.sa(0, 4)});
        t.run();
        g_fake_now += 1'000'000'000;
        t.run();
        CHECK(t.a.poll(t.cq_a).empty());
        CHECK(t.a.consumer_of(t.qa.sq) == 0);  // both wait, in order
        t.b.post_recv(t.qb.rq, 1, {t.sb(0, 4)});
        t.run();  // the timer has not expired yet
        g_fake_now += 1'000'000'000;
        t.run();
        auto rc = t.b.poll(t.cq_b);
        REQUIRE(rc.size() == 1);
        CHECK(std::memcmp(t.pb(0), "late", 4) == 0);
        auto sc = t.a.poll(t.cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].wr_id == 1);
        CHECK(t.a.consumer_of(t.qa.sq) == 1);
    }
}

TEST_CASE("a vanished peer puts its connected QPs in error at once", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    RcPair t(workers);
    t.b.post_recv(t.qb.rq, 1, {t.sb(0, 8)});
    t.beng().detach(t.b.ctx_id());  // guest b's process dies
    t.receive();  // two workers: a's is told through its link
    CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_ERR);
    t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(0, 8)});
    t.run();
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_WR_FLUSH_ERR);
}

TEST_CASE("a peer that is not connected gives RETRY_EXC_ERR", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    RcPair t(workers);
    abi::QpAttr reset{};
    reset.qp_state = IBV_QPS_RESET;
    REQUIRE(t.b.modify(t.qb.handle, IBV_QP_STATE, reset) == 0);
    t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(0, 8)});
    t.run();
    CHECK(t.a.poll(t.cq_a).empty());
    for (int i = 0; i < 8; ++i) {
        g_fake_now += 100'000'000;  // > 4.096us << 14
        t.run();
    }
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_RETRY_EXC_ERR);
    CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_ERR);
}

TEST_CASE("modify to ERR flushes send and receive queues", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    RcPair t(workers);
    t.b.post_recv(t.qb.rq, 1, {t.sb(0, 8)});
    t.b.post_recv(t.qb.rq, 2, {t.sb(0, 8)});
    abi::QpAttr a{};
    a.qp_state = IBV_QPS_ERR;
    REQUIRE(t.b.modify(t.qb.handle, IBV_QP_STATE, a) == 0);
    t.run();
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 2);
    for (auto& c : rc) {
        CHECK(c.status == IBV_WC_WR_FLUSH_ERR);
        CHECK(c.qp_num == t.qb.qpn);
        CHECK(c.opcode == IBV_WC_RECV);
    }
    t.b.post_recv(t.qb.rq, 3, {t.sb(0, 8)});  // posted after the error: flushed too
    t.b.post_send(t.qb.sq, send_wqe(4, IBV_WR_SEND, 0), {t.sb(0, 8)});
    t.run();
    rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 2);
    CHECK(rc[0].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(rc[1].status == IBV_WC_WR_FLUSH_ERR);
    // Back to RESET and reconnect: works again.
    a.qp_state = IBV_QPS_RESET;
    REQUIRE(t.b.modify(t.qb.handle, IBV_QP_STATE, a) == 0);
    CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_RESET);
}

TEST_CASE("CQ overrun puts the CQ in error and drops completions", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    TwoGuests t(workers);
    uint32_t pd = t.a.pd();
    auto cq = t.a.cq(2);
    auto q = t.a.qp(pd, cq, cq);
    t.a.connect_rc(q, 1, q.qpn, kAllAccess);  // loopback
    auto mr = t.a.mr(pd, 4096, kAllAccess);
    for (int i = 0; i < 3; ++i) {
        auto w = send_wqe(uint64_t(i), IBV_WR_RDMA_WRITE);
        w.remote_addr = mr.addr + 100;
        w.rkey = mr.rkey;
        t.a.post_send(q.sq, w, {abi::Sge{mr.addr, 8, mr.lkey}});
    }
    t.run();
    auto c = t.a.poll(cq);
    CHECK(c.size() == 2);
    CHECK(t.a.ctx().cqs.get(cq.handle)->error);
}

TEST_CASE("SRQ receives and the SRQ limit", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    TwoGuests t(workers);
    uint32_t pa = t.a.pd(), pb = t.b.pd();
    auto ca = t.a.cq(64), cb = t.b.cq(64);
    uint64_t ring = t.b.alloc(abi::wq_ring_bytes(16, 256));
    abi::CmdCreateSrqReq sr{};
    sr.ring_gva = ring;
    sr.pd_handle = pb;
    sr.entries = 16;
    sr.stride = 256;
    sr.max_sge = 4;
    auto r = t.b.cmd(CmdOp::CreateSrq, sr);
    REQUIRE(r.status == 0);
    uint32_t srq = r.as<abi::CmdCreateSrqResp>().srq_handle;
    auto qa = t.a.qp(pa, ca, ca);
    FakeProvider::QpSpec spec;
    spec.srq = srq;
    auto qb = t.b.qp(pb, cb, cb, spec);
    auto ma = t.a.mr(pa, 4096, kAllAccess), mb = t.b.mr(pb, 4096, kAllAccess);
    t.a.connect_rc(qa, 2, qb.qpn, kAllAccess);
    t.b.connect_rc(qb, 1, qa.qpn, kAllAccess);
    CHECK(t.b.cmd(CmdOp::DestroySrq, abi::CmdHandleReq{srq}).status == EBUSY);
    FakeProvider::WqView srq_wq{ring, 16, 256, 0};
    t.b.post_recv(srq_wq, 100, {abi::Sge{mb.addr, 64, mb.lkey}});
    t.b.post_recv(srq_wq, 101, {abi::Sge{mb.addr + 64, 64, mb.lkey}});
    REQUIRE(t.b.cmd(CmdOp::ModifySrq, abi::CmdModifySrqReq{srq, IBV_SRQ_LIMIT, 0, 2}).status == 0);
    std::memcpy(t.a.at(ma.addr), "srq!", 4);
    t.a.post_send(qa.sq, send_wqe(1, IBV_WR_SEND), {abi::Sge{ma.addr, 4, ma.lkey}});
    t.run();
    auto rc = t.b.poll(cb);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].wr_id == 100);
    CHECK(rc[0].qp_num == qb.qpn);
    CHECK(std::memcmp(t.b.at(mb.addr), "srq!", 4) == 0);
    auto q = t.b.cmd(CmdOp::QuerySrq, abi::CmdHandleReq{srq}).as<abi::CmdQuerySrqResp>();
    CHECK(q.srq_limit == 0);  // fired and disarmed
}

TEST_CASE("UD: GRH space, qkey, drops and CQE fields", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    TwoGuests t(workers);
    uint32_t pa = t.a.pd(), pb = t.b.pd();
    auto ca = t.a.cq(64), cb = t.b.cq(64);
    FakeProvider::QpSpec ud;
    ud.type = IBV_QPT_UD;
    auto qa = t.a.qp(pa, ca, ca, ud);
    auto qb = t.b.qp(pb, cb, cb, ud);
    t.a.ud_ready(qa, 0x1234);
    t.b.ud_ready(qb, 0x1234);
    auto ma = t.a.mr(pa, 8192, kAllAccess), mb = t.b.mr(pb, 8192, kAllAccess);
    abi::CmdCreateAhReq ahr{};
    ahr.pd_handle = pa;
    ahr.attr.dlid = 2;
    ahr.attr.port_num = 1;
    ahr.attr.sl = 5;
    uint32_t ah = t.a.cmd(CmdOp::CreateAh, ahr).as<abi::CmdCreateAhResp>().ah_handle;
    ahr.attr.is_global = 1;
    ahr.attr.hop_limit = 64;
    uint32_t ah_grh = t.a.cmd(CmdOp::CreateAh, ahr).as<abi::CmdCreateAhResp>().ah_handle;

    std::memcpy(t.a.at(ma.addr), "datagram", 8);
    auto ud_wqe = [&](uint64_t id, uint32_t ahh, uint32_t qkey) {
        auto w = send_wqe(id, IBV_WR_SEND_WITH_IMM);
        w.ah_handle = ahh;
        w.remote_qpn = qb.qpn;
        w.remote_qkey = qkey;
        w.imm_data = htonl(99);
        return w;
    };
    t.b.post_recv(qb.rq, 1, {abi::Sge{mb.addr, 100, mb.lkey}});
    t.b.post_recv(qb.rq, 2, {abi::Sge{mb.addr + 100, 100, mb.lkey}});
    t.a.post_send(qa.sq, ud_wqe(10, ah, 0x1234), {abi::Sge{ma.addr, 8, ma.lkey}});
    t.a.post_send(qa.sq, ud_wqe(11, ah, 0x9999), {abi::Sge{ma.addr, 8, ma.lkey}});  // wrong qkey: dropped
    t.a.post_send(qa.sq, ud_wqe(12, ah_grh, 0x80000000), {abi::Sge{ma.addr, 8, ma.lkey}});  // QP's own qkey
    t.run();
    auto sc = t.a.poll(ca);
    REQUIRE(sc.size() == 3);
    for (auto& c : sc) CHECK(c.status == IBV_WC_SUCCESS);
    auto rc = t.b.poll(cb);
    REQUIRE(rc.size() == 2);
    CHECK(rc[0].wr_id == 1);
    CHECK(rc[0].byte_len == 48);
    CHECK(rc[0].src_qp == qa.qpn);
    CHECK(rc[0].slid == 1);
    CHECK(rc[0].sl == 5);
    CHECK(rc[0].wc_flags == IBV_WC_WITH_IMM);
    CHECK(rc[0].imm_data == htonl(99));
    CHECK(std::memcmp(t.b.at(mb.addr + 40), "datagram", 8) == 0);
    CHECK(rc[1].wr_id == 2);
    CHECK(rc[1].wc_flags == (IBV_WC_WITH_IMM | IBV_WC_GRH));
    CHECK(t.b.at(mb.addr + 100)[0] >> 4 == 6);  // GRH IP version
    CHECK(std::memcmp(t.b.at(mb.addr + 140), "datagram", 8) == 0);

    // Receive buffer smaller than GRH + payload: LOC_LEN_ERR, QP stays up.
    t.b.post_recv(qb.rq, 3, {abi::Sge{mb.addr, 40, mb.lkey}});
    t.a.post_send(qa.sq, ud_wqe(13, ah, 0x1234), {abi::Sge{ma.addr, 8, ma.lkey}});
    t.run();
    rc = t.b.poll(cb);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].status == IBV_WC_LOC_LEN_ERR);
    CHECK(t.b.qp_state(qb.handle) == IBV_QPS_RTS);
    // Over the MTU: the sender fails; bad AH: the sender fails (SQE).
    t.a.post_send(qa.sq, ud_wqe(14, ah, 0x1234), {abi::Sge{ma.addr, 4097, ma.lkey}});
    t.run();
    sc = t.a.poll(ca);
    REQUIRE(sc.size() == 2);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[1].status == IBV_WC_LOC_LEN_ERR);
    CHECK(t.a.qp_state(qa.handle) == IBV_QPS_SQE);
    abi::QpAttr at{};
    at.qp_state = IBV_QPS_RTS;
    REQUIRE(t.a.modify(qa.handle, IBV_QP_STATE, at) == 0);
    t.a.post_send(qa.sq, ud_wqe(15, 12345, 0x1234), {abi::Sge{ma.addr, 8, ma.lkey}});
    t.run();
    sc = t.a.poll(ca);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_LOC_QP_OP_ERR);
    // A datagram to a QP that does not exist is dropped, the send succeeds.
    REQUIRE(t.a.modify(qa.handle, IBV_QP_STATE, at) == 0);
    auto w = ud_wqe(16, ah, 0x1234);
    w.remote_qpn = 0xabcdef;
    t.a.post_send(qa.sq, w, {abi::Sge{ma.addr, 8, ma.lkey}});
    t.run();
    sc = t.a.poll(ca);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
}

TEST_CASE("detaching a context frees everything and leaves others running", "[shim][transport]") {
    const Workers workers = Workers::One;  // the two contexts of one engine
    RcPair t(workers);
    CHECK(t.eng.context_count() == 2);
    t.eng.detach(t.a.ctx_id());
    CHECK(t.eng.context_count() == 1);
    CHECK(!t.eng.qpns().find(1, t.qa.qpn));
    CHECK(t.eng.qpns().find(2, t.qb.qpn));
    CHECK(!t.eng.qpns().find(1, t.qb.qpn));  // right QPN, wrong LID
}

TEST_CASE("RESET drops posted WQEs; indices keep running", "[shim][transport]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    RcPair t(workers);
    abi::QpAttr a{};
    a.qp_state = IBV_QPS_RESET;
    REQUIRE(t.a.modify(t.qa.handle, IBV_QP_STATE, a) == 0);
    t.a.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(0, 4)});  // never executed
    t.run();
    REQUIRE(t.a.modify(t.qa.handle, IBV_QP_STATE, a) == 0);  // RESET -> RESET
    CHECK(t.a.consumer_of(t.qa.sq) == 1);
    t.a.connect_rc(t.qa, 2, t.qb.qpn, kAllAccess);
    t.b.post_recv(t.qb.rq, 7, {t.sb(0, 64)});
    t.a.post_send(t.qa.sq, send_wqe(2, IBV_WR_SEND), {t.sa(0, 4)});
    t.run();
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].wr_id == 2);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(t.b.poll(t.cq_b).size() == 1);
}
