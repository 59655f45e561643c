// Completion events on the host, the shim's side (cq_events.h): which
// completion raises the event of an arming, where the guest's poll and its
// arming fall against the shim's publication of a CQE. The guest here is
// the in-process harness, so the test decides the interleaving that real
// threads only hit in a window of nanoseconds.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "shim_harness.h"
#include "vrdma_common/unique_fd.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;

namespace {

constexpr uint32_t kChannel = 7;
constexpr uint64_t kCqHandle = 0xb0b;

// a sends to b; b's CQ has a completion channel, read from `events`.
struct ChannelPair : TwoGuests {
    UniqueFd events;
    FakeProvider::CqView cq_a, cq_b;
    FakeProvider::QpView qa, qb;
    FakeProvider::MrInfo ma, mb;
    ChannelPair() {
        int fds[2];
        REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
        events = UniqueFd(fds[0]);
        REQUIRE(b.ctx().add_channel(kChannel, UniqueFd(fds[1])) == 0);
        const uint32_t pd_a = a.pd(), pd_b = b.pd();
        cq_a = a.cq(64);
        cq_b = FakeProvider::CqView{0, b.alloc(abi::cq_ring_bytes(64)), 64, 0};
        abi::CmdCreateCqReq req{};
        req.ring_gva = cq_b.ring;
        req.user_handle = kCqHandle;
        req.entries = 64;
        req.channel_id = kChannel;
        auto r = b.cmd(abi::CmdOp::CreateCq, req);
        REQUIRE(r.status == 0);
        cq_b.handle = r.as<abi::CmdCreateCqResp>().cq_handle;
        qa = a.qp(pd_a, cq_a, cq_a);
        qb = b.qp(pd_b, cq_b, cq_b);
        ma = a.mr(pd_a, 4096, kAllAccess);
        mb = b.mr(pd_b, 4096, kAllAccess);
        a.connect_rc(qa, 2, qb.qpn, kAllAccess);
        b.connect_rc(qb, 1, qa.qpn, kAllAccess);
    }
    // ibv_req_notify_cq on b's CQ: a new arm_seq, then the doorbell.
    void arm() {
        auto* notify = reinterpret_cast<abi::CqNotify*>(b.at(cq_b.ring) + sizeof(abi::RingHeader));
        notify->arm_solicited.store(0);
        notify->arm_seq.fetch_add(1);
        b.doorbell();
    }
    // The event records on the channel so far.
    std::vector<uint64_t> read_events() {
        std::vector<uint64_t> out;
        uint64_t rec;
        while (::read(events.get(), &rec, sizeof(rec)) == ssize_t(sizeof(rec))) out.push_back(rec);
        return out;
    }
    void send_to_b(uint64_t wr_id) {
        b.post_recv(qb.rq, wr_id, {abi::Sge{mb.addr, 64, mb.lkey}});
        run(2);
        a.post_send(qa.sq, send_wqe(wr_id, IBV_WR_SEND), {abi::Sge{ma.addr, 8, ma.lkey}});
    }
};

}  // namespace

TEST_CASE("an arming made before a completion is published raises its event even when the guest polls the "
          "completion before the shim looks at the arming",
          "[shim][events]") {
    ChannelPair t;
    t.arm();
    t.run(2);
    REQUIRE(t.read_events().empty());  // nothing to wake it yet
    t.send_to_b(41);
    // The guest's poll lands between the shim's publication of the receive
    // completion and its look at arm_seq: its consumer index is already past
    // the completion when the shim looks. (Written before the pass here; the
    // shim reads the index only after publishing.)
    t.b.ring_header(t.cq_b.ring)->consumer.store(1);
    t.run(1);
    CHECK(t.read_events() == std::vector<uint64_t>{kCqHandle});
    // The completion is whole, and the arming is used: the next completion
    // raises nothing until the guest arms again.
    auto got = t.b.poll(t.cq_b);
    REQUIRE(got.size() == 1);
    CHECK(got[0].wr_id == 41);
    CHECK(got[0].status == IBV_WC_SUCCESS);
    t.send_to_b(42);
    t.run(2);
    CHECK(t.read_events().empty());
    REQUIRE(t.b.poll(t.cq_b).size() == 1);
    t.a.poll(t.cq_a);
}

TEST_CASE("an arming made after the guest polled every completion waits for the next one", "[shim][events]") {
    ChannelPair t;
    t.send_to_b(51);
    t.run(2);
    REQUIRE(t.b.poll(t.cq_b).size() == 1);  // polled while the CQ was not armed
    t.arm();
    t.run(2);
    CHECK(t.read_events().empty());  // as an HCA, which arms against the consumer index
    t.send_to_b(52);
    t.run(2);
    CHECK(t.read_events() == std::vector<uint64_t>{kCqHandle});
    REQUIRE(t.b.poll(t.cq_b).size() == 1);
    t.a.poll(t.cq_a);
}

// The indices of a ring of 4 come round every 8 completions, so that after
// 8 a process in a VM would read none since its arming (vm_events.cpp
// counts them with RingHeader::produced instead).
TEST_CASE("a CQ's ring counts its completions past the wrap of its indices and across a resize", "[shim][events]") {
    TwoGuests t;
    const uint32_t pd_a = t.a.pd(), pd_b = t.b.pd();
    auto cq_a = t.a.cq(4);
    auto cq_b = t.b.cq(64);
    auto qa = t.a.qp(pd_a, cq_a, cq_a);
    auto qb = t.b.qp(pd_b, cq_b, cq_b);
    auto ma = t.a.mr(pd_a, 4096, kAllAccess);
    auto mb = t.b.mr(pd_b, 4096, kAllAccess);
    t.a.connect_rc(qa, 2, qb.qpn, kAllAccess);
    t.b.connect_rc(qb, 1, qa.qpn, kAllAccess);
    auto send_one = [&](uint64_t wr_id) {
        t.b.post_recv(qb.rq, wr_id, {abi::Sge{mb.addr, 64, mb.lkey}});
        t.a.post_send(qa.sq, send_wqe(wr_id, IBV_WR_SEND), {abi::Sge{ma.addr, 8, ma.lkey}});
        t.run(2);
        REQUIRE(t.a.poll(cq_a).size() == 1);
        REQUIRE(t.b.poll(cq_b).size() == 1);
    };
    CHECK(t.a.ring_header(cq_a.ring)->produced.load() == 0);
    for (uint64_t i = 1; i <= 8; ++i) send_one(i);
    CHECK(t.a.ring_header(cq_a.ring)->producer.load() == 0);  // where it started
    CHECK(t.a.ring_header(cq_a.ring)->produced.load() == 8);
    send_one(9);
    CHECK(t.a.ring_header(cq_a.ring)->producer.load() == 1);
    CHECK(t.a.ring_header(cq_a.ring)->produced.load() == 9);

    // A resize starts the indices again; the count goes on in the new ring.
    const uint64_t ring = t.a.alloc(abi::cq_ring_bytes(16));
    abi::CmdResizeCqReq r{};
    r.cq_handle = cq_a.handle;
    r.ring_gva = ring;
    r.entries = 16;
    r.cqe = 15;
    REQUIRE(t.a.cmd(abi::CmdOp::ResizeCq, r).status == 0);
    cq_a.ring = ring;
    cq_a.entries = 16;
    cq_a.cons = 0;
    CHECK(t.a.ring_header(ring)->producer.load() == 0);
    CHECK(t.a.ring_header(ring)->produced.load() == 9);
    send_one(10);
    CHECK(t.a.ring_header(ring)->producer.load() == 1);
    CHECK(t.a.ring_header(ring)->produced.load() == 10);
    // The other guest's CQ counts its own.
    CHECK(t.b.ring_header(cq_b.ring)->produced.load() == 10);
}
