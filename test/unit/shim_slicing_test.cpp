// Work per turn (docs/protocol.md): a large message between two guests of
// one shim moves a slice at a time across the engine's passes, other
// guests are served in between, and a transfer its requester abandons
// fails the receive it took; with one worker (the local transport copies
// each slice) and with two (the worker link hands each slice to the other
// worker, which copies it).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>
#include <functional>

#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;
using abi::CmdOp;

namespace {

constexpr uint32_t kBig = 2 << 20;  // 32 slices, several turns

// a's QP connected to b's, 2 MiB MRs; a's MR holds a pattern.
struct BigPair : TwoGuests {
    uint32_t pd_a, pd_b;
    FakeProvider::CqView cq_a, cq_b;
    FakeProvider::QpView qa, qb;
    FakeProvider::MrInfo ma, mb;
    explicit BigPair(Workers w) : TwoGuests(w) {
        pd_a = a.pd();
        pd_b = b.pd();
        cq_a = a.cq(64);
        cq_b = b.cq(64);
        qa = a.qp(pd_a, cq_a, cq_a);
        qb = b.qp(pd_b, cq_b, cq_b);
        ma = a.mr(pd_a, kBig, kAllAccess);
        mb = b.mr(pd_b, kBig, kAllAccess);
        a.connect_rc(qa, 2, qb.qpn, kAllAccess);
        b.connect_rc(qb, 1, qa.qpn, kAllAccess);
        for (uint32_t i = 0; i < kBig; ++i) a.at(ma.addr)[i] = uint8_t(i * 7 + i / 4096);
    }
    bool arrived(uint64_t bytes) { return std::memcmp(a.at(ma.addr), b.at(mb.addr), bytes) == 0; }
    void send_big(uint64_t wr_id = 1) {
        b.post_recv(qb.rq, 50, {abi::Sge{mb.addr, kBig, mb.lkey}});
        a.post_send(qa.sq, send_wqe(wr_id, IBV_WR_SEND), {abi::Sge{ma.addr, kBig, ma.lkey}});
    }
};

}  // namespace

TEST_CASE("a message larger than a slice moves over several turns; completions come with its last byte",
          "[shim][transport][slicing]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    t.send_big();
    t.a.post_send(t.qa.sq, send_wqe(2, IBV_WR_RDMA_WRITE), {});  // behind it: waits for it
    t.run(1);
    // One turn: at most the turn's budget of bytes, no completion yet.
    CHECK(t.b.at(t.mb.addr)[0] == t.a.at(t.ma.addr)[0]);
    CHECK_FALSE(t.arrived(TurnScheduler::kTurnBudget + 1));
    CHECK(t.a.poll(t.cq_a).empty());
    CHECK(t.b.poll(t.cq_b).empty());
    t.run(int(kBig / TurnScheduler::kTurnBudget) + 2);
    CHECK(t.arrived(kBig));
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].status == IBV_WC_SUCCESS);
    CHECK(rc[0].byte_len == kBig);
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(sc.size() == 2);
    CHECK(sc[0].wr_id == 1);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[1].wr_id == 2);
    CHECK(sc[1].status == IBV_WC_SUCCESS);
}

TEST_CASE("a large RDMA READ moves over several turns and arrives intact", "[shim][transport][slicing]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    auto w = send_wqe(9, IBV_WR_RDMA_READ);
    w.remote_addr = t.ma.addr;
    w.rkey = t.ma.rkey;
    // b reads a's pattern: b is the requester here.
    t.b.post_send(t.qb.sq, w, {abi::Sge{t.mb.addr, kBig, t.mb.lkey}});
    t.run(1);
    CHECK(t.b.poll(t.cq_b).empty());
    t.run(int(kBig / TurnScheduler::kTurnBudget) + 2);
    CHECK(t.arrived(kBig));
    auto sc = t.b.poll(t.cq_b);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[0].byte_len == kBig);
}

TEST_CASE("another guest is served between the slices of a large message", "[shim][transport][slicing]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    // b sends a small message back to a meanwhile: it completes in the
    // first pass, long before a's 2 MiB send.
    t.a.post_recv(t.qa.rq, 60, {abi::Sge{t.ma.addr, 64, t.ma.lkey}});
    t.send_big();
    t.b.post_send(t.qb.sq, send_wqe(3, IBV_WR_SEND), {abi::Sge{t.mb.addr + kBig - 64, 64, t.mb.lkey}});
    t.run(workers == Workers::One ? 1 : 2);  // two workers: the answer crosses back
    auto bc = t.b.poll(t.cq_b);
    REQUIRE(bc.size() == 1);
    CHECK(bc[0].wr_id == 3);
    CHECK(bc[0].status == IBV_WC_SUCCESS);
    auto ac = t.a.poll(t.cq_a);
    REQUIRE(ac.size() == 1);
    CHECK(ac[0].wr_id == 60);
    t.run(int(kBig / TurnScheduler::kTurnBudget) + 2);
    CHECK(t.a.poll(t.cq_a).size() == 1);
}

TEST_CASE("a large message whose requester QP is destroyed mid-way fails the receive it took",
          "[shim][transport][slicing]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    t.send_big();
    t.run(1);
    REQUIRE(t.a.cmd(CmdOp::DestroyQp, abi::CmdHandleReq{t.qa.handle}).status == 0);
    t.run(2);
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].wr_id == 50);
    CHECK(rc[0].status == IBV_WC_REM_ABORT_ERR);
    CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_ERR);
}

TEST_CASE("a large message whose responder QP goes to error mid-way flushes the receive it took; no more of it lands",
          "[shim][transport][slicing]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    t.send_big();
    t.run(1);
    abi::QpAttr err{};
    err.qp_state = IBV_QPS_ERR;
    REQUIRE(t.b.modify(t.qb.handle, IBV_QP_STATE, err) == 0);
    const std::vector<uint8_t> landed(t.b.at(t.mb.addr), t.b.at(t.mb.addr) + kBig);
    t.run(3);
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].wr_id == 50);
    CHECK(rc[0].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(std::memcmp(landed.data(), t.b.at(t.mb.addr), kBig) == 0);
    CHECK_FALSE(t.arrived(kBig));
    for (const auto& c : t.a.poll(t.cq_a)) CHECK(c.status != IBV_WC_SUCCESS);
}

TEST_CASE("a large message whose WQE the guest rewrites mid-way is abandoned, never mixed",
          "[shim][transport][slicing]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    t.send_big();
    t.run(1);
    // The guest rewrites the WQE in its slot (the shim reads it again each
    // turn): now a 4-byte send. The 2 MiB transfer stops; the receive it
    // took fails; the rewritten WQE is executed as a new message.
    uint8_t* slot = t.a.wqe_slot(t.qa.sq, 0);
    abi::Sge sge{t.ma.addr, 4, t.ma.lkey};
    std::memcpy(slot + sizeof(abi::SendWqe), &sge, sizeof(sge));
    t.run(2);
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(!rc.empty());
    CHECK(rc[0].wr_id == 50);
    CHECK(rc[0].status == IBV_WC_REM_ABORT_ERR);
    CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_ERR);
}

TEST_CASE("a large message whose requester loses its memory mid-way fails at both ends",
          "[shim][transport][slicing]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    t.send_big();
    t.run(1);
    // The requester's MR goes away under the transfer: the next slice finds
    // no lkey, the send completes with LOC_PROT_ERR and the QP fails; the
    // receive the transfer took is not left taken.
    REQUIRE(t.a.cmd(CmdOp::DeregMr, abi::CmdHandleReq{t.ma.handle}).status == 0);
    t.run(3);
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(!sc.empty());
    CHECK(sc[0].wr_id == 1);
    CHECK(sc[0].status == IBV_WC_LOC_PROT_ERR);
    auto rc = t.b.poll(t.cq_b);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].wr_id == 50);
    CHECK(rc[0].status == IBV_WC_REM_ABORT_ERR);
    CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_ERR);
}

namespace {
// A clock that calls g_on_clock at every reading (the engine reads it at
// each turn's start and end and around each timed copy): the tests look
// inside a pass with it.
std::function<void()> g_on_clock;
uint64_t observing_clock() {
    if (g_on_clock) g_on_clock();
    return g_fake_now;
}
}  // namespace

TEST_CASE("a small message waits behind another guest's large transfer for at most one slice",
          "[shim][transport][slicing]") {
    // a sends 2 MiB to b, alone at first (whole turns). Then, six times, b
    // sends a's QP 64 bytes; the bytes of a's transfer that land between
    // b's post and b's completion must be at most one slice (with turns of
    // kTurnBudget whatever waits, they were a whole budget, 256 KiB). Six
    // trials: the pass starts with either guest.
    BigPair t(Workers::One);
    const auto inbox = t.a.mr(t.pd_a, 4096, kAllAccess);  // b's small messages land here
    t.send_big();
    t.run(1);
    REQUIRE_FALSE(t.arrived(kBig));
    // Bytes of a's message in b's memory (it lands in order, a page at a time).
    auto landed = [&] {
        uint64_t n = 0;
        while (n < kBig && std::memcmp(t.b.at(t.mb.addr) + n, t.a.at(t.ma.addr) + n, 16) == 0) n += 4096;
        return n;
    };
    auto completed = [&] { return t.b.ring_header(t.cq_b.ring)->producer.load() != t.cq_b.cons; };
    uint64_t worst = 0;
    for (int trial = 0; trial < 6; ++trial) {
        CAPTURE(trial);
        t.a.post_recv(t.qa.rq, 60, {abi::Sge{inbox.addr, 64, inbox.lkey}});
        const uint64_t before = landed();
        uint64_t at_completion = UINT64_MAX;
        g_on_clock = [&] {
            if (at_completion == UINT64_MAX && completed()) at_completion = landed();
        };
        t.eng.set_clock(observing_clock);
        t.b.post_send(t.qb.sq, send_wqe(100 + trial, IBV_WR_SEND), {abi::Sge{t.mb.addr + kBig - 64, 64, t.mb.lkey}});
        t.run(1);
        t.eng.set_clock(fake_clock);
        g_on_clock = nullptr;
        auto bc = t.b.poll(t.cq_b);
        REQUIRE(bc.size() == 1);
        CHECK(bc[0].status == IBV_WC_SUCCESS);
        REQUIRE(at_completion != UINT64_MAX);
        worst = std::max(worst, at_completion - before);
        REQUIRE(t.a.poll(t.cq_a).size() == 1);  // the 64 bytes arrived
    }
    INFO("most bytes of a's transfer moved while b's message waited: " << worst);
    CHECK(worst <= TurnScheduler::kCopySlice);
    t.run(int(kBig / TurnScheduler::kCopySlice) + 8);
    CHECK(t.arrived(kBig - 64));
}

TEST_CASE("a guest's contexts share one turn: more contexts do not buy more of the shim",
          "[shim][transport][slicing]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    // A second process of guest a, with its own 2 MiB send to b.
    FakeProvider a2(t.eng, t.ga);
    const uint32_t pd2 = a2.pd();
    auto cq2 = a2.cq(64);
    auto q2 = a2.qp(pd2, cq2, cq2);
    auto m2 = a2.mr(pd2, kBig, kAllAccess);
    auto qb2 = t.b.qp(t.pd_b, t.cq_b, t.cq_b);
    auto mb2 = t.b.mr(t.pd_b, kBig, kAllAccess);
    a2.connect_rc(q2, 2, qb2.qpn, kAllAccess);
    t.b.connect_rc(qb2, 1, q2.qpn, kAllAccess);
    std::memset(a2.at(m2.addr), 0x5a, kBig);
    t.b.post_recv(qb2.rq, 51, {abi::Sge{mb2.addr, kBig, mb2.lkey}});
    t.send_big();
    a2.post_send(q2.sq, send_wqe(2, IBV_WR_SEND), {abi::Sge{m2.addr, kBig, m2.lkey}});
    // Each pass moves at most one budget (and the slice that crosses it)
    // for guest a, whatever number of contexts it has.
    auto landed = [&] {
        uint64_t n = 0;
        for (uint64_t i = 0; i < kBig; i += 4096) {
            // 16 bytes of a's pattern are never all zero (b's fresh memory).
            n += std::memcmp(t.b.at(t.mb.addr) + i, t.a.at(t.ma.addr) + i, 16) == 0 ? 4096 : 0;
            n += t.b.at(mb2.addr)[i] == 0x5a ? 4096 : 0;
        }
        return n;
    };
    for (int pass = 1; pass <= 4; ++pass) {
        t.run(1);
        CHECK(landed() <= uint64_t(pass) * (TurnScheduler::kTurnBudget + TurnScheduler::kSliceBytes));
    }
    // Both sends progress (the pass starts at a different context each time)
    // and both complete.
    CHECK(t.b.at(mb2.addr)[0] == 0x5a);
    CHECK(t.b.at(t.mb.addr)[0] == t.a.at(t.ma.addr)[0]);
    t.run(int(2 * kBig / TurnScheduler::kTurnBudget) + 8);
    CHECK(t.arrived(kBig));
    CHECK(std::memcmp(t.b.at(mb2.addr), a2.at(m2.addr), kBig) == 0);
    CHECK(t.a.poll(t.cq_a).size() == 1);
    CHECK(a2.poll(cq2).size() == 1);
}

namespace {

// One worker: a sends 2 MiB to b and b 2 MiB to a at once, a with weight 3.
struct WeightedPair : BigPair {
    FakeProvider::MrInfo a_in, b_out;
    WeightedPair() : BigPair(Workers::One) {
        eng.guests().set_weight(ga, 3);
        a_in = a.mr(pd_a, kBig, kAllAccess);
        b_out = b.mr(pd_b, kBig, kAllAccess);
        std::memset(b.at(b_out.addr), 0x3c, kBig);
        std::memset(b.at(mb.addr), 0xff, kBig);  // by_a misses the 2 pages of a's pattern that start with 0xff
        a.post_recv(qa.rq, 60, {abi::Sge{a_in.addr, kBig, a_in.lkey}});
        send_big();  // a -> b
        b.post_send(qb.sq, send_wqe(3, IBV_WR_SEND), {abi::Sge{b_out.addr, kBig, b_out.lkey}});
    }
    // Bytes (in 4 KiB pages) that landed so far, sent by a and by b.
    static uint64_t pages(const uint8_t* p, bool (*landed)(uint8_t)) {
        uint64_t n = 0;
        for (uint64_t i = 0; i < kBig; i += 4096) n += landed(p[i]) ? 4096 : 0;
        return n;
    }
    uint64_t by_a() { return pages(b.at(mb.addr), [](uint8_t v) { return v != 0xff; }); }
    uint64_t by_b() { return pages(a.at(a_in.addr), [](uint8_t v) { return v == 0x3c; }); }
    // Both messages complete, intact.
    void finish() {
        run(int(2 * kBig / TurnScheduler::kCopySlice) + 8);
        CHECK(a.poll(cq_a).size() == 2);  // its send and the receive of b's
        CHECK(b.poll(cq_b).size() == 2);
        CHECK(arrived(kBig));
        CHECK(by_b() == kBig);
    }
};

uint64_t g_clock_step = 0;
// A clock that moves g_clock_step at every reading: a copy's time is one
// step (payload_move.cpp reads the clock before and after).
uint64_t stepping_clock() { return g_fake_now += g_clock_step; }

}  // namespace

TEST_CASE("a guest's weight is its share of each pass beside the worker's other guests",
          "[shim][transport][slicing]") {
    // The fake clock never moves, so turns are charged by bytes. Both
    // guests have work all along, so each turn gives way after its small
    // budget: every pass gives a three small turns and b one (each plus
    // at most the slice that crosses it).
    WeightedPair t;
    t.run(1);
    CHECK(t.by_a() >= 3 * TurnScheduler::kSmallTurn);
    CHECK(t.by_a() <= 3 * TurnScheduler::kSmallTurn + TurnScheduler::kCopySlice);
    CHECK(t.by_b() >= TurnScheduler::kSmallTurn);
    CHECK(t.by_b() <= TurnScheduler::kSmallTurn + TurnScheduler::kCopySlice);
    t.run(15);
    INFO("bytes moved in 16 passes: a (weight 3) " << t.by_a() << ", b (weight 1) " << t.by_b());
    CHECK(double(t.by_a()) / double(t.by_b()) >= 2.5);
    CHECK(double(t.by_a()) / double(t.by_b()) <= 3.5);
    CHECK(t.ga.weight == 3);
    CHECK(t.gb.weight == 1);
    CHECK(t.ga.load.yields > 0);
    // Out-of-range weights are clamped, never 0 (a guest never served).
    t.eng.guests().set_weight(t.gb, 0);
    CHECK(t.gb.weight == 1);
    t.eng.guests().set_weight(t.gb, 1000);
    CHECK(t.gb.weight == kMaxGuestWeight);
    t.eng.guests().set_weight(t.gb, 1);
    t.finish();
}

TEST_CASE("weights hold when a slice costs more than a budget: what a turn overspends comes off the next",
          "[shim][transport][slicing]") {
    // A 16 KiB slice "takes" 25 us here, many small budgets: each guest
    // overshoots with its first slice in every turn it gets. Without the
    // debt carried to the next passes they would move a slice a pass each
    // (1 x); with it, 3 x.
    WeightedPair t;
    g_clock_step = 25'000 / 2;  // two readings a copy
    t.eng.set_clock(stepping_clock);
    t.run(400);
    t.eng.set_clock(fake_clock);
    const double by_a = double(t.by_a()), by_b = double(t.by_b());
    INFO("bytes moved in 400 passes: a (weight 3) " << by_a << ", b (weight 1) " << by_b);
    REQUIRE(by_b > 0);
    CHECK(by_a / by_b >= 2.5);
    CHECK(by_a / by_b <= 3.5);
    t.finish();
}

TEST_CASE("a large message whose transfer outlasts the QP's timeout still arrives once, intact",
          "[shim][transport][slicing]") {
    // The requester's local ACK timeout (14: 67 ms) passes while the
    // message is half moved (a busy responder worker, a preempted shim):
    // slices that keep arriving are progress, not a lost request.
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    BigPair t(workers);
    t.send_big();
    t.run(2);
    CHECK_FALSE(t.arrived(kBig));
    for (int i = 0; i < 4 && !t.arrived(kBig); ++i) {
        g_fake_now += 100'000'000;  // 100 ms between passes
        t.run(4);
    }
    t.run(int(kBig / TurnScheduler::kSliceBytes) + 8);
    CHECK(t.arrived(kBig));
    auto ac = t.a.poll(t.cq_a);
    auto bc = t.b.poll(t.cq_b);
    REQUIRE(ac.size() == 1);
    CHECK(ac[0].status == IBV_WC_SUCCESS);
    REQUIRE(bc.size() == 1);
    CHECK(bc[0].status == IBV_WC_SUCCESS);
    CHECK(bc[0].byte_len == kBig);
}
