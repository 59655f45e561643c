// Finding work (docs/protocol.md "Finding work"): the shim looks at a QP
// when its guest's work bit or the shim itself says it has work. Idle QPs
// cost nothing, and neither does a control command: creating, changing or
// querying one object, or anything else on the command ring, does not make
// the shim look at every QP of the context. Counted, not timed: the guest's
// qp_visits (vrdmactl load) says how many QPs its turns looked at.
#include <catch2/catch.hpp>
#include <cstring>

#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;
using abi::CmdOp;

namespace {
constexpr uint32_t kAccessNoAtomics = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// A QP with small rings: thousands of them fit in the test arena.
QpSpec small_qp() {
    QpSpec s;
    s.entries = 4;
    s.stride = 256;
    s.rq_stride = 64;
    s.max_sge = 1;
    s.max_inline = 64;
    return s;
}
}  // namespace

TEST_CASE("finding work: commands and a QP's work bit cost O(1), not O(QPs)", "[shim][engine]") {
    TwoGuests t;
    const uint32_t pd = t.a.pd();
    auto cq = t.a.cq(64);
    const QpSpec small = small_qp();
    constexpr int kIdle = 1000;
    for (int i = 0; i < kIdle; ++i) (void)t.a.qp(pd, cq, cq, small);
    t.run();
    const GuestLoad& load = t.ga.load;

    // Commands: 50 PDs, an MR, a CQ, a query of a QP.
    uint64_t before = load.qp_visits;
    for (int i = 0; i < 50; ++i) (void)t.a.pd();
    (void)t.a.mr(pd, 4096, kAccessNoAtomics);
    (void)t.a.cq(16);
    t.run();
    CHECK(load.qp_visits - before == 0);

    // A connected pair among the idle QPs: connecting looks at the two QPs
    // (what was posted before may go), a message at them only.
    auto pb = t.b.pd();
    auto cqb = t.b.cq(64);
    auto qa = t.a.qp(pd, cq, cq);
    auto qb = t.b.qp(pb, cqb, cqb);
    auto ma = t.a.mr(pd, 4096, kAccessNoAtomics);
    auto mb = t.b.mr(pb, 4096, kAccessNoAtomics);
    before = load.qp_visits;
    t.a.connect_rc(qa, 2, qb.qpn, kAccessNoAtomics);
    t.b.connect_rc(qb, 1, qa.qpn, kAccessNoAtomics);
    t.run();
    CHECK(load.qp_visits - before <= 6);  // each of the connecting commands marks the QP
    before = load.qp_visits;
    t.b.post_recv(qb.rq, 1, std::vector<abi::Sge>{abi::Sge{mb.addr, 64, mb.lkey}});
    t.a.post_send(qa.sq, send_wqe(2, IBV_WR_SEND), std::vector<abi::Sge>{abi::Sge{ma.addr, 64, ma.lkey}});
    t.run();
    CHECK(t.a.poll(cq).size() == 1);
    CHECK(t.b.poll(cqb).size() == 1);
    CHECK(load.qp_visits - before <= 2);
}

TEST_CASE("finding work: past 4096 QPs a work bit names a few QPs, and commands still cost O(1)", "[shim][engine]") {
    TwoGuests t;
    const uint32_t pd = t.a.pd();
    auto cq = t.a.cq(64);
    const QpSpec small = small_qp();
    for (uint32_t i = 0; i < abi::kWorkSlots; ++i) (void)t.a.qp(pd, cq, cq, small);
    // This QP's table slot is past the work slots: it shares a bit.
    auto qa = t.a.qp(pd, cq, cq);
    CHECK(qa.sq.work_slot < abi::kWorkSlots);
    auto pb = t.b.pd();
    auto cqb = t.b.cq(64);
    auto qb = t.b.qp(pb, cqb, cqb);
    auto ma = t.a.mr(pd, 4096, kAccessNoAtomics);
    auto mb = t.b.mr(pb, 4096, kAccessNoAtomics);
    t.a.connect_rc(qa, 2, qb.qpn, kAccessNoAtomics);
    t.b.connect_rc(qb, 1, qa.qpn, kAccessNoAtomics);
    t.run();
    const GuestLoad& load = t.ga.load;
    uint64_t before = load.qp_visits;
    (void)t.a.pd();
    t.run();
    CHECK(load.qp_visits - before == 0);
    before = load.qp_visits;
    std::memcpy(t.a.at(ma.addr), "past the slots", 14);
    t.b.post_recv(qb.rq, 1, std::vector<abi::Sge>{abi::Sge{mb.addr, 64, mb.lkey}});
    t.a.post_send(qa.sq, send_wqe(2, IBV_WR_SEND), std::vector<abi::Sge>{abi::Sge{ma.addr, 14, ma.lkey}});
    t.run();
    CHECK(t.a.poll(cq).size() == 1);
    CHECK(t.b.poll(cqb).size() == 1);
    CHECK(std::memcmp(t.b.at(mb.addr), "past the slots", 14) == 0);
    CHECK(load.qp_visits - before <= 4);  // the QPs sharing its bit
}

TEST_CASE("finding work: a context with an SRQ is looked at whole when its doorbell rings", "[shim][engine]") {
    // An SRQ has no work bit: its receives come with the doorbell, and the
    // QPs on it may need them (a device SRQ is fed through them).
    TwoGuests t;
    const uint32_t pd = t.a.pd();
    auto cq = t.a.cq(64);
    FakeProvider::WqView ring;
    uint32_t srq = 0;
    REQUIRE(t.a.create_srq(pd, 16, 64, 1, ring, srq) == 0);
    for (int i = 0; i < 10; ++i) (void)t.a.qp(pd, cq, cq);
    t.run();
    const uint64_t before = t.ga.load.qp_visits;
    (void)t.a.pd();
    t.run();
    CHECK(t.ga.load.qp_visits - before >= 10);
}
