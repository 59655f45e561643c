// Tag-matching rendezvous with the sender on another worker or shim
// (tag_matching.h): the receiving QP's own reads and FIN through the worker
// link and the fabric, with the engines' passes under the test's control,
// so that the sender can go away, or the receiver fail, between the match
// and the read. The happy paths run through the real libibverbs in
// verbs_tm_test.cpp.
#include <endian.h>
#include <infiniband/tm_types.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "qp_state.h"
#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;
using abi::CmdOp;

namespace {

constexpr uint32_t kAccessNoAtomics = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// Guest a's QP sends rendezvous requests to guest b's QP, whose receives
// come from a TM SRQ.
struct TmRendezvous : TwoGuests {
    uint32_t pd_a, pd_b, srq = 0;
    FakeProvider::CqView cq_a, cq_b;
    FakeProvider::QpView qa, qb;
    FakeProvider::MrInfo ma, mb;
    explicit TmRendezvous(Workers w) : TwoGuests(w) {
        pd_a = a.pd();
        pd_b = b.pd();
        cq_a = a.cq(64);
        cq_b = b.cq(64);
        abi::CmdCreateSrqReq r{};
        r.ring_gva = b.alloc(abi::wq_ring_bytes(16, 256));
        r.pd_handle = pd_b;
        r.entries = 16;
        r.stride = 256;
        r.max_sge = 1;
        r.srq_type = IBV_SRQT_TM;
        r.cq_handle = cq_b.handle;
        r.max_num_tags = 8;
        auto res = b.cmd(CmdOp::CreateSrq, r);
        REQUIRE(res.status == 0);
        srq = res.as<abi::CmdCreateSrqResp>().srq_handle;
        QpSpec s;
        s.srq = srq;
        qa = a.qp(pd_a, cq_a, cq_a);
        qb = b.qp(pd_b, cq_b, cq_b, s);
        ma = a.mr(pd_a, 1 << 20, kAccessNoAtomics);
        mb = b.mr(pd_b, 1 << 20, kAccessNoAtomics);
        a.connect_rc(qa, 2, qb.qpn, kAccessNoAtomics);
        b.connect_rc(qb, 1, qa.qpn, kAccessNoAtomics);
    }
    // A tagged buffer of b: `len` bytes at `off` of its MR.
    void add_tag(uint64_t tag, uint64_t off, uint32_t len, uint64_t wr_id) {
        abi::CmdTmOpReq op{};
        op.srq_handle = srq;
        op.opcode = IBV_WR_TAG_ADD;
        op.recv_wr_id = wr_id;
        op.tag = tag;
        op.mask = ~0ull;
        op.num_sge = 1;
        op.sge[0] = abi::Sge{mb.addr + off, len, mb.lkey};
        REQUIRE(b.cmd(CmdOp::TmOp, op).status == 0);
    }
    // a's rendezvous request for `len` bytes at `off` of its MR, the
    // headers at `hdr` of its MR.
    void send_rndv(uint64_t tag, uint64_t off, uint32_t len, uint64_t hdr = 0) {
        ibv_tmh t{};
        t.opcode = IBV_TMH_RNDV;
        t.app_ctx = htobe32(7);
        t.tag = htobe64(tag);
        ibv_rvh r{};
        r.va = htobe64(ma.addr + off);
        r.rkey = htobe32(ma.rkey);
        r.len = htobe32(len);
        std::memcpy(a.at(ma.addr + hdr), &t, sizeof(t));
        std::memcpy(a.at(ma.addr + hdr + sizeof(t)), &r, sizeof(r));
        a.post_send(qa.sq, send_wqe(1, IBV_WR_SEND), {abi::Sge{ma.addr + hdr, 32, ma.lkey}});
    }
    // Until b's worker has matched the request (and answered it) and
    // nothing else: a's pass sends it, b's worker takes it.
    void match() {
        eng.poll_once();
        receive();
    }
    // A receive at a for the FIN, b's tagged buffer for 8 KiB, and a's
    // request, matched by b.
    void matched_rendezvous() {
        a.post_recv(qa.rq, 50, {abi::Sge{ma.addr + 900000, 64, ma.lkey}});
        add_tag(0x99, 0, 8192, 5);
        send_rndv(0x99, 4096, 8192);
        match();
    }
    void set_state(FakeProvider& p, const FakeProvider::QpView& q, uint32_t state) {
        abi::QpAttr at{};
        at.qp_state = state;
        REQUIRE(p.modify(q.handle, IBV_QP_STATE, at) == 0);
    }
    // b's TM completions, without the ADD's (none: unsignaled).
    std::vector<abi::Cqe> b_completions() { return b.poll(cq_b); }
};

}  // namespace

TEST_CASE("TM rendezvous across workers or shims: the data, the FIN, and the sender's send completes first",
          "[shim][tm]") {
    const Workers workers = GENERATE(Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    TmRendezvous t(workers);
    for (uint32_t i = 0; i < 200000; ++i) t.a.at(t.ma.addr + 4096)[i] = uint8_t(i * 7 + 1);
    t.a.post_recv(t.qa.rq, 50, {abi::Sge{t.ma.addr + 900000, 64, t.ma.lkey}});
    t.add_tag(0x99, 0, 200000, 5);
    t.send_rndv(0x99, 4096, 200000);  // four pieces, the last short
    t.run(8);
    auto c = t.b_completions();
    REQUIRE(c.size() == 2);
    CHECK(c[0].wr_id == 5);
    CHECK(c[0].wc_flags == IBV_WC_TM_MATCH);
    CHECK(c[0].tm_tag == 0x99);
    CHECK(c[1].status == IBV_WC_SUCCESS);
    CHECK(c[1].wc_flags == IBV_WC_TM_DATA_VALID);
    CHECK(c[1].byte_len == 200000);
    CHECK(std::memcmp(t.b.at(t.mb.addr), t.a.at(t.ma.addr + 4096), 200000) == 0);
    auto s = t.a.poll(t.cq_a);
    REQUIRE(s.size() == 2);
    CHECK(s[0].wr_id == 1);  // the send, then the FIN
    CHECK(s[0].status == IBV_WC_SUCCESS);
    CHECK(s[1].wr_id == 50);
    CHECK(s[1].opcode == IBV_WC_RECV);
    CHECK(s[1].byte_len == 32);
    CHECK(t.a.at(t.ma.addr + 900000)[0] == IBV_TMH_FIN);
}

TEST_CASE("TM rendezvous across workers or shims: a sender that went away fails it, the FIN is not sent",
          "[shim][tm]") {
    const Workers workers = GENERATE(Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    TmRendezvous t(workers);
    t.matched_rendezvous();
    t.set_state(t.a, t.qa, IBV_QPS_RESET);  // before b's QP reads
    t.run(8);
    auto c = t.b_completions();
    REQUIRE(c.size() == 2);
    CHECK(c[0].wc_flags == IBV_WC_TM_MATCH);
    CHECK(c[1].wr_id == 5);
    CHECK(c[1].status == IBV_WC_REM_ABORT_ERR);
    auto s = t.a.poll(t.cq_a);
    REQUIRE(s.size() == 1);  // the send, acknowledged at the match; no FIN
    CHECK(s[0].wr_id == 1);
    CHECK(t.b.qp_state(t.qb.handle) == IBV_QPS_RTS);  // b's QP goes on
}

TEST_CASE("TM rendezvous across workers or shims: the receiver failing meanwhile completes it flushed",
          "[shim][tm]") {
    const Workers workers = GENERATE(Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    TmRendezvous t(workers);
    t.matched_rendezvous();
    t.beng().poll_once();  // b's QP sends its read
    t.set_state(t.b, t.qb, IBV_QPS_ERR);
    t.run(8);  // the read's answer comes to a QP in error
    auto c = t.b_completions();
    REQUIRE(c.size() == 2);
    CHECK(c[0].wc_flags == IBV_WC_TM_MATCH);
    CHECK(c[1].wr_id == 5);
    CHECK(c[1].status == IBV_WC_WR_FLUSH_ERR);
    auto s = t.a.poll(t.cq_a);
    REQUIRE(s.size() == 1);  // the send; no FIN
    CHECK(s[0].wr_id == 1);
}

TEST_CASE("TM rendezvous across shims: a peer shim lost before the answer fails it after the QP's timeout",
          "[shim][tm]") {
    TmRendezvous t(Workers::Fabric);
    t.matched_rendezvous();
    t.eng2.poll_once();  // b's QP sends its read; the link goes before it arrives
    t.fabric->lb->close("test: the peer shim is gone");
    t.eng2.poll_once();
    auto c = t.b_completions();
    REQUIRE(c.size() == 1);  // the match; the read waits for its timeout
    g_fake_now += ack_timeout_ns(14) + 1;
    t.eng2.poll_once();
    c = t.b_completions();
    REQUIRE(c.size() == 1);
    CHECK(c[0].wr_id == 5);
    CHECK(c[0].status == IBV_WC_REM_ABORT_ERR);
}

TEST_CASE("TM rendezvous: a FIN that finds no receive posted at the sender is lost, the data still completes",
          "[shim][tm]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two, Workers::Fabric);
    CAPTURE(workers_name(workers));
    TmRendezvous t(workers);
    t.add_tag(0x99, 0, 8192, 5);
    t.send_rndv(0x99, 4096, 8192);  // a has no receive posted
    t.run(8);
    auto c = t.b_completions();
    REQUIRE(c.size() == 2);
    CHECK(c[1].wr_id == 5);
    CHECK(c[1].status == IBV_WC_SUCCESS);
    CHECK(c[1].wc_flags == IBV_WC_TM_DATA_VALID);
    CHECK(std::memcmp(t.b.at(t.mb.addr), t.a.at(t.ma.addr + 4096), 8192) == 0);
    // A receive posted afterwards gets nothing: the FIN is not sent again.
    t.a.post_recv(t.qa.rq, 50, {abi::Sge{t.ma.addr + 900000, 64, t.ma.lkey}});
    t.run(8);
    auto s = t.a.poll(t.cq_a);
    REQUIRE(s.size() == 1);
    CHECK(s[0].wr_id == 1);  // the send only
    CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_RTS);
}
