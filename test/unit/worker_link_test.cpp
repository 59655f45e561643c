// Two workers of one shim (docs/protocol.md "Workers"): what the worker
// link adds to the semantics every transport shares (those run in
// shim_transport_test.cpp and shim_slicing_test.cpp with one worker and
// with two): a full inbox is back-pressure that loses nothing, and two
// workers on their own threads keep every opcode's data and completions
// right (run under ThreadSanitizer by scripts/test-tsan.sh).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <thread>

#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;

namespace {

constexpr uint32_t kMrBytes = 4 << 20;

// Guest a on worker 0 and guest b on worker 1, `pairs` RC QP pairs between
// them (deep queues), one 4 MiB MR each.
struct CrossPairs : TwoGuests {
    uint32_t pd_a, pd_b;
    FakeProvider::CqView cq_a, cq_b;
    std::vector<FakeProvider::QpView> qa, qb;
    FakeProvider::MrInfo ma, mb;
    explicit CrossPairs(int pairs, uint32_t entries = 256) : TwoGuests(Workers::Two) {
        pd_a = a.pd();
        pd_b = b.pd();
        cq_a = a.cq(4096);
        cq_b = b.cq(4096);
        QpSpec spec;
        spec.entries = entries;
        for (int i = 0; i < pairs; ++i) {
            qa.push_back(a.qp(pd_a, cq_a, cq_a, spec));
            qb.push_back(b.qp(pd_b, cq_b, cq_b, spec));
            a.connect_rc(qa[i], 2, qb[i].qpn, kAllAccess, 7, 7, 1);
            b.connect_rc(qb[i], 1, qa[i].qpn, kAllAccess, 7, 7, 1);
        }
        ma = a.mr(pd_a, kMrBytes, kAllAccess);
        mb = b.mr(pd_b, kMrBytes, kAllAccess);
    }
    uint8_t* pa(uint64_t off = 0) { return a.at(ma.addr + off); }
    uint8_t* pb(uint64_t off = 0) { return b.at(mb.addr + off); }
    abi::Sge sa(uint64_t off, uint32_t len) { return abi::Sge{ma.addr + off, len, ma.lkey}; }
    abi::Sge sb(uint64_t off, uint32_t len) { return abi::Sge{mb.addr + off, len, mb.lkey}; }
};

}  // namespace

TEST_CASE("two workers: a full inbox holds requests back and loses nothing", "[shim][workers]") {
    // 300 sends on one QP, more than the inbox holds (WorkerInbox::kDepth),
    // handed over while b's worker receives nothing: the rest wait (the
    // ring_full count says so), then all arrive in order.
    constexpr uint32_t kSends = 300;
    static_assert(kSends > WorkerInbox::kDepth);
    CrossPairs t(1, 512);
    for (uint32_t i = 0; i < kSends; ++i) t.b.post_recv(t.qb[0].rq, 1000 + i, {t.sb(i * 8, 8)});
    for (uint32_t i = 0; i < kSends; ++i) {
        std::memcpy(t.pa(i * 8), &i, 4);
        t.a.post_send(t.qa[0].sq, send_wqe(i, IBV_WR_SEND), {t.sa(i * 8, 8)});
    }
    for (int pass = 0; pass < 4; ++pass) t.eng.poll_once();  // a's worker alone
    CHECK(t.link_ab->stats().requests_out == WorkerInbox::kDepth);
    CHECK(t.link_ab->stats().ring_full > 0);
    t.run(40);
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == kSends);
    for (uint32_t i = 0; i < kSends; ++i) {
        CHECK(rc[i].wr_id == 1000 + i);
        CHECK(rc[i].status == IBV_WC_SUCCESS);
        uint32_t v;
        std::memcpy(&v, t.pb(i * 8), 4);
        CHECK(v == i);
    }
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == kSends);
    for (uint32_t i = 0; i < kSends; ++i) CHECK(sc[i].wr_id == i);
}

TEST_CASE("two workers on their own threads: every opcode between their guests, data verified", "[shim][workers]") {
    // Each engine runs on a thread of its own, as the shim's workers do,
    // with the real clock; this thread is both guests' processes. Rounds of
    // SEND (b posts the receives), WRITE with immediate, READ, fetch-and-
    // add and compare-and-swap on one counter from every QP, and one WRITE
    // large enough to go in slices, on 4 QP pairs at once.
    constexpr int kPairs = 4, kRounds = 40;
    CrossPairs t(kPairs);
    t.eng.set_clock(monotonic_ns);
    t.eng2.set_clock(monotonic_ns);
    const uint64_t counter = kMrBytes - 8;  // in b's MR
    std::memset(t.pb(counter), 0, 8);
    for (uint32_t i = 0; i < 1 << 20; ++i) t.pa(1 << 20)[i] = uint8_t(i * 13 + i / 4096);

    std::atomic<bool> stop{false};
    WorkerLink* to_a[2] = {nullptr, t.link_ab.get()};
    WorkerLink* to_b[2] = {t.link_ba.get(), nullptr};
    auto worker = [&stop](Engine& e, WorkerLink& out, WorkerInbox& in, WorkerLink** links) {
        while (!stop.load()) {
            e.poll_once();
            out.flush();
            if (!receive_messages(in, links, 2, TurnScheduler::kTurnBudget)) std::this_thread::yield();
        }
    };
    std::thread wa(worker, std::ref(t.eng), std::ref(*t.link_ab), std::ref(t.inbox_a), to_a);
    std::thread wb(worker, std::ref(t.eng2), std::ref(*t.link_ba), std::ref(t.inbox_b), to_b);

    auto wait_cqes = [&](FakeProvider& p, FakeProvider::CqView& cq, size_t n) {
        std::vector<abi::Cqe> got;
        const uint64_t deadline = monotonic_ns() + 20'000'000'000ull;
        while (got.size() < n && monotonic_ns() < deadline) {
            auto more = p.poll(cq);
            got.insert(got.end(), more.begin(), more.end());
            if (more.empty()) std::this_thread::yield();
        }
        return got;
    };
    uint64_t adds = 0;
    for (int round = 0; round < kRounds; ++round) {
        for (int q = 0; q < kPairs; ++q) {
            const uint64_t slot = uint64_t(q) * 4096;  // each QP's own 4 KiB of both MRs
            t.b.post_recv(t.qb[q].rq, 100 + q, {t.sb(slot, 64)});
            t.b.post_recv(t.qb[q].rq, 200 + q, {});
            std::memset(t.pa(slot), uint8_t(round + q), 64);
            std::memset(t.pb(slot + 1024), uint8_t(round * 3 + q), 256);
            t.a.post_send(t.qa[q].sq, send_wqe(1, IBV_WR_SEND), {t.sa(slot, 64)});
            auto w = send_wqe(2, IBV_WR_RDMA_WRITE_WITH_IMM);
            w.remote_addr = t.mb.addr + slot + 512;
            w.rkey = t.mb.rkey;
            w.imm_data = uint32_t(round);
            t.a.post_send(t.qa[q].sq, w, {t.sa(slot, 64)});
            w = send_wqe(3, IBV_WR_RDMA_READ);
            w.remote_addr = t.mb.addr + slot + 1024;
            w.rkey = t.mb.rkey;
            t.a.post_send(t.qa[q].sq, w, {t.sa(slot + 1024, 256)});
            w = send_wqe(4, IBV_WR_ATOMIC_FETCH_AND_ADD);
            w.remote_addr = t.mb.addr + counter;
            w.rkey = t.mb.rkey;
            w.compare_add = 1;
            t.a.post_send(t.qa[q].sq, w, {t.sa(slot + 2048, 8)});
            ++adds;
            w = send_wqe(5, IBV_WR_ATOMIC_CMP_AND_SWP);
            w.remote_addr = t.mb.addr + counter;
            w.rkey = t.mb.rkey;
            w.compare_add = ~0ull;  // never equal: returns the value, changes nothing
            w.swap = 0;
            t.a.post_send(t.qa[q].sq, w, {t.sa(slot + 2056, 8)});
        }
        // One 1 MiB WRITE (16 slices) from the first QP.
        auto big = send_wqe(6, IBV_WR_RDMA_WRITE);
        big.remote_addr = t.mb.addr + (2 << 20);
        big.rkey = t.mb.rkey;
        t.a.post_send(t.qa[0].sq, big, {t.sa(1 << 20, 1 << 20)});

        auto sc = wait_cqes(t.a, t.cq_a, kPairs * 5 + 1);
        auto rc = wait_cqes(t.b, t.cq_b, kPairs * 2);
        REQUIRE(sc.size() == kPairs * 5 + 1);
        REQUIRE(rc.size() == kPairs * 2);
        for (auto& c : sc) CHECK(c.status == IBV_WC_SUCCESS);
        for (auto& c : rc) CHECK(c.status == IBV_WC_SUCCESS);
        for (int q = 0; q < kPairs; ++q) {
            const uint64_t slot = uint64_t(q) * 4096;
            CHECK(t.pb(slot)[0] == uint8_t(round + q));
            CHECK(t.pb(slot)[63] == uint8_t(round + q));
            CHECK(std::memcmp(t.pb(slot + 512), t.pa(slot), 64) == 0);
            CHECK(t.pa(slot + 1024)[0] == uint8_t(round * 3 + q));
            CHECK(t.pa(slot + 1024)[255] == uint8_t(round * 3 + q));
            uint64_t fetched, compared;
            std::memcpy(&fetched, t.pa(slot + 2048), 8);
            std::memcpy(&compared, t.pa(slot + 2056), 8);
            CHECK(fetched < adds);
            CHECK(compared >= fetched + 1);
        }
        CHECK(std::memcmp(t.pb(2 << 20), t.pa(1 << 20), 1 << 20) == 0);
        std::memset(t.pb(2 << 20), 0, 1 << 20);
    }
    uint64_t total;
    std::memcpy(&total, t.pb(counter), 8);
    CHECK(total == adds);
    stop = true;
    wa.join();
    wb.join();
}

TEST_CASE("two workers: an RNR NAK under a full pipeline costs no retries", "[shim][workers]") {
    // Sends pipelined to a QP without receives: the first gets an RNR NAK,
    // every one behind it a sequence NAK naming the same PSN, and all of
    // them come back after the requester went back to that PSN. Those
    // sequence NAKs are the echo of requests sent before it went back, not
    // news: with retry_cnt 1 they must not end the QP in RETRY_EXC_ERR
    // (responder NAKs a PSN once on IB; rxe does the same).
    constexpr uint32_t kSends = 40;
    CrossPairs t(1, 64);
    // retry_cnt 1, rnr_retry 7 (forever), min_rnr_timer 1 (0.01 ms).
    abi_client::RcPath p;
    auto reconnect = [&](FakeProvider& g, const FakeProvider::QpView& q, uint16_t dlid, uint32_t dqpn) {
        REQUIRE(g.modify(q.handle, IBV_QP_STATE, [] {
                    abi::QpAttr a{};
                    a.qp_state = IBV_QPS_RESET;
                    return a;
                }()) == 0);
        g.connect_rc(q, dlid, dqpn, kAllAccess, 7, 1, 1);
    };
    reconnect(t.a, t.qa[0], 2, t.qb[0].qpn);
    reconnect(t.b, t.qb[0], 1, t.qa[0].qpn);
    for (uint32_t i = 0; i < kSends; ++i) t.a.post_send(t.qa[0].sq, send_wqe(i, IBV_WR_SEND), {t.sa(i * 8, 8)});
    // b's worker answers one request a step (a busy worker), and the RNR
    // timer runs out while most of the sequence NAKs are still to come.
    WorkerLink* to_a[2] = {nullptr, t.link_ab.get()};
    WorkerLink* to_b[2] = {t.link_ba.get(), nullptr};
    auto step = [&] {
        t.eng.poll_once();
        receive_messages(t.inbox_b, to_b, 2, 1);
        t.eng2.poll_once();
        t.link_ba->flush();
        receive_messages(t.inbox_a, to_a, 2, UINT64_MAX);
        g_fake_now += 20'000;  // 20 us: past the RNR timer (10 us)
    };
    for (int i = 0; i < 4 * int(kSends); ++i) step();
    for (uint32_t i = 0; i < kSends; ++i) t.b.post_recv(t.qb[0].rq, 100 + i, {t.sb(i * 8, 8)});
    for (int i = 0; i < 8 * int(kSends); ++i) step();
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == kSends);
    for (auto& c : sc) CHECK(c.status == IBV_WC_SUCCESS);
    CHECK(t.b.poll(t.cq_b).size() == kSends);
}
