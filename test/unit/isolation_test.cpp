// Tenant isolation in the engine (docs/reliability.md "What a tenant can do
// to another"): a QP that gets the QPN of a vanished peer cannot talk to
// the peer's old partner, QPNs are unpredictable and not reused soon.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;
using abi::CmdOp;

namespace {

// Guest a's QP connected to guest b's QP X; a second process of guest b
// (the attacker) ready to take X's number.
struct Hijack : TwoGuests {
    FakeProvider b2{eng, gb};
    uint32_t pd_a, pd_b, pd_c;
    FakeProvider::CqView cq_a, cq_b, cq_c;
    FakeProvider::QpView qa, qb, qc;
    FakeProvider::MrInfo ma, mc;
    Hijack() {
        pd_a = a.pd();
        pd_b = b.pd();
        pd_c = b2.pd();
        cq_a = a.cq(64);
        cq_b = b.cq(64);
        cq_c = b2.cq(64);
        qa = a.qp(pd_a, cq_a, cq_a);
        qb = b.qp(pd_b, cq_b, cq_b);
        qc = b2.qp(pd_c, cq_c, cq_c);
        ma = a.mr(pd_a, 4096, kAllAccess);
        mc = b2.mr(pd_c, 4096, kAllAccess);
        std::memset(a.at(ma.addr), 0x5a, 4096);
        std::memset(b2.at(mc.addr), 0xee, 4096);
        a.connect_rc(qa, 2, qb.qpn, kAllAccess, 7, 1);
        b.connect_rc(qb, 1, qa.qpn, kAllAccess, 7, 1);
        a.post_recv(qa.rq, 1, {abi::Sge{ma.addr, 4096, ma.lkey}});
    }
    // The attacker's QP now answers to X (what cycling QPNs would achieve).
    void take_qpn(uint32_t x) {
        Qp* q = b2.ctx().qps.get(qc.handle);
        REQUIRE(q);
        eng.qpns().remove(q->qpn);
        q->qpn = x;
        eng.qpns().add(x, b2.ctx(), qc.handle);
    }
    // SEND, RDMA WRITE and RDMA READ against a's QP and MR: every one must
    // fail, and a's memory and receive queue must stay as they were.
    void attack() {
        b2.connect_rc(qc, 1, qa.qpn, kAllAccess, 0, 0);
        std::vector<uint32_t> ops = {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ};
        for (uint32_t op : ops) {
            auto w = send_wqe(op, op);
            w.remote_addr = ma.addr;
            w.rkey = ma.rkey;
            b2.post_send(qc.sq, w, {abi::Sge{mc.addr, 64, mc.lkey}});
            for (int i = 0; i < 4; ++i) {
                g_fake_now += 1'000'000'000;
                run();
            }
        }
        // Nor does a's traffic reach the newcomer.
        b2.post_recv(qc.rq, 50, {abi::Sge{mc.addr + 1024, 1024, mc.lkey}});
        a.post_send(qa.sq, send_wqe(60, IBV_WR_SEND), {abi::Sge{ma.addr, 64, ma.lkey}});
        for (int i = 0; i < 8; ++i) {
            g_fake_now += 1'000'000'000;
            run();
        }
        auto sc = b2.poll(cq_c);
        REQUIRE(!sc.empty());
        for (auto& c : sc) CHECK(c.status != IBV_WC_SUCCESS);
        CHECK(sc[0].status == IBV_WC_RETRY_EXC_ERR);  // as if nobody were there
        for (auto& c : a.poll(cq_a)) CHECK(c.status != IBV_WC_SUCCESS);
        std::vector<uint8_t> want(4096, 0x5a), mine(4096, 0xee);
        CHECK(std::memcmp(a.at(ma.addr), want.data(), 4096) == 0);
        CHECK(std::memcmp(b2.at(mc.addr), mine.data(), 4096) == 0);  // READ brought nothing
    }
};

}  // namespace

TEST_CASE("after its peer QP is destroyed, an RC QP's sends end in RETRY_EXC_ERR", "[shim][isolation]") {
    Hijack t;
    REQUIRE(t.b.cmd(CmdOp::DestroyQp, abi::CmdHandleReq{t.qb.handle}).status == 0);
    t.a.post_send(t.qa.sq, send_wqe(9, IBV_WR_SEND), {abi::Sge{t.ma.addr, 8, t.ma.lkey}});
    for (int i = 0; i < 4; ++i) {
        g_fake_now += 1'000'000'000;
        t.run();
    }
    auto sc = t.a.poll(t.cq_a);
    REQUIRE(!sc.empty());
    CHECK(sc[0].wr_id == 9);
    CHECK(sc[0].status == IBV_WC_RETRY_EXC_ERR);
    CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_ERR);
}

TEST_CASE("a QP that gets a destroyed peer's QPN cannot reach the old partner", "[shim][isolation]") {
    Hijack t;
    const uint32_t x = t.qb.qpn;
    REQUIRE(t.b.cmd(CmdOp::DestroyQp, abi::CmdHandleReq{t.qb.handle}).status == 0);
    t.take_qpn(x);
    REQUIRE(t.a.qp_state(t.qa.handle) == IBV_QPS_RTS);  // as on a fabric: nobody told it
    t.attack();
}

TEST_CASE("QPNs are random, never 0 or 1, and a freed QPN is not handed out again soon", "[shim][isolation]") {
    TwoGuests t;
    uint32_t pd = t.b.pd();
    auto cq = t.b.cq(16);
    FakeProvider::QpView v;
    const auto req = t.b.qp_req(pd, cq, cq, QpSpec{}, v);  // the same rings every time
    std::vector<uint32_t> qpns;
    std::set<uint32_t> seen;
    constexpr int kCycles = 20000;  // < SharedTables::kQpnQuarantine: every QPN must be new
    for (int i = 0; i < kCycles; ++i) {
        auto r = t.b.cmd(CmdOp::CreateQp, req);
        REQUIRE(r.status == 0);
        auto q = r.as<abi::CmdCreateQpResp>();
        qpns.push_back(q.qpn);
        REQUIRE(t.b.cmd(CmdOp::DestroyQp, abi::CmdHandleReq{q.qp_handle}).status == 0);
    }
    int consecutive = 0;
    int ones[24] = {};
    for (size_t i = 0; i < qpns.size(); ++i) {
        CHECK(qpns[i] >= 2);
        CHECK(qpns[i] <= 0xffffff);
        CHECK(seen.insert(qpns[i]).second);
        if (i && qpns[i] == qpns[i - 1] + 1) ++consecutive;
        for (int b = 0; b < 24; ++b) ones[b] += (qpns[i] >> b) & 1;
    }
    CHECK(seen.size() == size_t(kCycles));
    CHECK(consecutive < 5);  // a counter would give kCycles - 1
    for (int b = 0; b < 24; ++b) {
        INFO("bit " << b);
        CHECK(ones[b] > kCycles * 45 / 100);
        CHECK(ones[b] < kCycles * 55 / 100);
    }
}

TEST_CASE("keys: 100,000 live MRs have distinct, patternless rkeys; a revoked rkey is not reissued soon",
          "[shim][isolation]") {
    TwoGuests t;
    uint32_t pd = t.b.pd();
    const uint64_t addr = t.b.alloc(4096, 4096);
    constexpr int kMrs = 100000;
    std::vector<uint32_t> keys, handles;
    keys.reserve(kMrs);
    for (int i = 0; i < kMrs; ++i) {
        FakeProvider::MrInfo m;
        REQUIRE(t.b.reg_mr(pd, addr, 4096, kAllAccess, m) == 0);
        REQUIRE(m.lkey == m.rkey);
        CHECK(m.rkey != m.handle);  // the handle is guessable (a slot number)
        keys.push_back(m.rkey);
        handles.push_back(m.handle);
    }
    std::set<uint32_t> distinct(keys.begin(), keys.end());
    CHECK(distinct.size() == size_t(kMrs));
    // No usable pattern: consecutive differences rarely repeat, every bit is
    // set in about half the keys (a 6-sigma band), and so is every bit of
    // the XOR of consecutive keys.
    std::set<uint32_t> diffs;
    int ones[32] = {}, flips[32] = {};
    for (size_t i = 0; i < keys.size(); ++i) {
        if (i) diffs.insert(keys[i] - keys[i - 1]);
        for (int b = 0; b < 32; ++b) {
            ones[b] += (keys[i] >> b) & 1;
            if (i) flips[b] += ((keys[i] ^ keys[i - 1]) >> b) & 1;
        }
    }
    CHECK(diffs.size() > size_t(kMrs) * 99 / 100);
    for (int b = 0; b < 32; ++b) {
        INFO("bit " << b);
        CHECK(std::abs(ones[b] - kMrs / 2) < 1000);
        CHECK(std::abs(flips[b] - kMrs / 2) < 1000);
    }
    // Deregister KeyTable::kQuarantine of them and register as many again:
    // no new key is one just revoked.
    std::set<uint32_t> revoked;
    for (size_t i = 0; i < KeyTable::kQuarantine; ++i) {
        REQUIRE(t.b.cmd(CmdOp::DeregMr, abi::CmdHandleReq{handles[i]}).status == 0);
        revoked.insert(keys[i]);
    }
    for (size_t i = 0; i < KeyTable::kQuarantine; ++i) {
        FakeProvider::MrInfo m;
        REQUIRE(t.b.reg_mr(pd, addr, 4096, kAllAccess, m) == 0);
        CHECK(!revoked.count(m.rkey));
    }
}

TEST_CASE("a guessed rkey is refused, counted per guest and per QP, and fails the target QP", "[shim][isolation]") {
    Hijack t;
    Qp* target = t.a.ctx().qps.get(t.qa.handle);
    REQUIRE(target);
    // b writes to a with the key the old scheme gave every process's first
    // MR, and with a's real key off by one.
    for (uint32_t guess : {0x40000001u, t.ma.rkey ^ 1u}) {
        if (t.a.qp_state(t.qa.handle) != IBV_QPS_RTS) break;
        auto w = send_wqe(guess, IBV_WR_RDMA_WRITE);
        w.remote_addr = t.ma.addr;
        w.rkey = guess;
        FakeProvider::MrInfo mb = t.b.mr(t.pd_b, 4096, kAllAccess);
        t.b.post_send(t.qb.sq, w, {abi::Sge{mb.addr, 64, mb.lkey}});
        t.run();
        auto sc = t.b.poll(t.cq_b);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_ACCESS_ERR);
    }
    std::vector<uint8_t> want(4096, 0x5a);
    CHECK(std::memcmp(t.a.at(t.ma.addr), want.data(), 4096) == 0);
    CHECK(t.a.qp_state(t.qa.handle) == IBV_QPS_ERR);  // as the spec says: the responder QP fails
    CHECK(target->remote_access_errors == 1);
    CHECK(t.eng.guests().security_of(t.ga).remote_access_errors == 1);
}

TEST_CASE("requests from strangers are counted per guest and per QP", "[shim][isolation]") {
    Hijack t;
    const uint32_t x = t.qb.qpn;
    REQUIRE(t.b.cmd(CmdOp::DestroyQp, abi::CmdHandleReq{t.qb.handle}).status == 0);
    t.take_qpn(x);
    t.attack();
    Qp* target = t.a.ctx().qps.get(t.qa.handle);
    REQUIRE(target);
    CHECK(target->stranger_requests >= 1);  // its first request; the rest flush with its QP
    CHECK(t.eng.guests().security_of(t.ga).stranger_requests >= 1);
}

TEST_CASE("a controlled qkey (high bit) is refused unless the operator allows it", "[shim][isolation]") {
    Engine eng;
    const GuestIdentity& plain = eng.add_guest("a", 1, 0x1111);
    const GuestIdentity& allowed = eng.add_guest("b", 2, 0x2222, true);
    for (const GuestIdentity* g : {&plain, &allowed}) {
        FakeProvider p(eng, *g);
        uint32_t pd = p.pd();
        auto cq = p.cq(16);
        QpSpec ud;
        ud.type = IBV_QPT_UD;
        auto q = p.qp(pd, cq, cq, ud);
        abi::QpAttr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qkey = 0x80010000;
        const uint32_t mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        CHECK(p.modify(q.handle, mask, a) == (g == &plain ? EPERM : 0));
        a.qkey = 0x11111111;  // an ordinary qkey: always fine
        CHECK(p.modify(q.handle, mask, a) == 0);
        a.qp_state = IBV_QPS_INIT;
        a.qkey = 0xffffffff;
        CHECK(p.modify(q.handle, IBV_QP_QKEY, a) == (g == &plain ? EPERM : 0));
    }
}

TEST_CASE("the PSNs set by modify_qp are honoured: a request the responder did not expect is not executed",
          "[shim][isolation]") {
    TwoGuests t;
    uint32_t pd_a = t.a.pd(), pd_b = t.b.pd();
    auto cq_a = t.a.cq(16), cq_b = t.b.cq(16);
    auto qa = t.a.qp(pd_a, cq_a, cq_a), qb = t.b.qp(pd_b, cq_b, cq_b);
    auto ma = t.a.mr(pd_a, 4096, kAllAccess), mb = t.b.mr(pd_b, 4096, kAllAccess);
    std::memset(t.a.at(ma.addr), 0x11, 64);
    std::memset(t.b.at(mb.addr), 0x77, 64);
    abi_client::RcPath pa, pb;
    pa.dlid = 2;
    pa.dqpn = qb.qpn;
    pa.sq_psn = 0x1000;  // a sends from 0x1000 ...
    pb.dlid = 1;
    pb.dqpn = qa.qpn;
    pb.rq_psn = 0x1010;  // ... but b was told to expect 0x1010: a's first 16 look like old duplicates
    REQUIRE(t.a.abi_client::Client::connect_rc(qa.handle, pa) == 0);
    REQUIRE(t.b.abi_client::Client::connect_rc(qb.handle, pb) == 0);
    auto w = send_wqe(1, IBV_WR_RDMA_WRITE);
    w.remote_addr = mb.addr;
    w.rkey = mb.rkey;
    t.a.post_send(qa.sq, w, {abi::Sge{ma.addr, 64, ma.lkey}});
    t.b.post_recv(qb.rq, 2, {abi::Sge{mb.addr + 1024, 64, mb.lkey}});
    t.a.post_send(qa.sq, send_wqe(3, IBV_WR_SEND), {abi::Sge{ma.addr, 64, ma.lkey}});
    t.run();
    std::vector<uint8_t> want(64, 0x77);
    CHECK(std::memcmp(t.b.at(mb.addr), want.data(), 64) == 0);  // the WRITE was not executed
    CHECK(t.b.poll(cq_b).empty());                              // nor the SEND delivered
}

// Guest b guesses a's rkey over and over, each time on a new connection
// (every wrong guess fails both QPs). Past the limit its RDMA requests are
// dropped unexamined, even one with the right key, while SENDs still pass;
// once it kept below the rate for a while, RDMA works again.
TEST_CASE("a source that keeps guessing rkeys is throttled", "[shim][isolation]") {
    TwoGuests t;
    t.eng.guess_throttle().set_limit(2);  // 2 at once, then 2 a second
    const uint32_t pd_a = t.a.pd(), pd_b = t.b.pd();
    auto cq_a = t.a.cq(256), cq_b = t.b.cq(256);
    auto ma = t.a.mr(pd_a, 4096, kAllAccess), mb = t.b.mr(pd_b, 4096, kAllAccess);
    std::memset(t.a.at(ma.addr), 0x5a, 4096);
    std::memset(t.b.at(mb.addr), 0x77, 4096);
    // One WQE from b to a on a new pair of QPs; the status of b's completion.
    auto attempt = [&](uint32_t opcode, uint32_t rkey) {
        auto qa = t.a.qp(pd_a, cq_a, cq_a), qb = t.b.qp(pd_b, cq_b, cq_b);
        t.a.connect_rc(qa, 2, qb.qpn, kAllAccess, 7, 1);
        t.b.connect_rc(qb, 1, qa.qpn, kAllAccess, 7, 1);
        t.a.post_recv(qa.rq, 1, {abi::Sge{ma.addr + 2048, 2048, ma.lkey}});
        auto w = send_wqe(2, opcode);
        w.remote_addr = ma.addr;
        w.rkey = rkey;
        t.b.post_send(qb.sq, w, {abi::Sge{mb.addr, 64, mb.lkey}});
        std::vector<abi::Cqe> sc;
        for (int i = 0; i < 8; ++i) {
            t.run();
            sc = t.b.poll(cq_b);
            if (!sc.empty()) break;
            g_fake_now += 70'000'000;  // past the QP's timeout (14: 67 ms); 0.14 tokens
        }
        (void)t.a.poll(cq_a);
        REQUIRE(sc.size() == 1);
        return sc[0].status;
    };
    for (int i = 0; i < 2; ++i) CHECK(attempt(IBV_WR_RDMA_WRITE, ma.rkey ^ (0x100u << i)) == IBV_WC_REM_ACCESS_ERR);
    CHECK(t.eng.guests().security_of(t.ga).remote_access_errors == 2);
    // Throttled: the right key does not help, nothing is written.
    CHECK(attempt(IBV_WR_RDMA_WRITE, ma.rkey) == IBV_WC_RETRY_EXC_ERR);
    CHECK(attempt(IBV_WR_RDMA_READ, ma.rkey) == IBV_WC_RETRY_EXC_ERR);
    CHECK(t.eng.guests().security_of(t.ga).throttled_requests >= 2);
    std::vector<uint8_t> want(4096, 0x5a);
    CHECK(std::memcmp(t.a.at(ma.addr), want.data(), 2048) == 0);
    CHECK(attempt(IBV_WR_SEND, 0) == IBV_WC_SUCCESS);  // no key: not throttled
    // Guest a, which guessed nothing, is not throttled towards b.
    CHECK(!t.eng.guess_throttle().throttled(1, t.eng.now()));
    // A second later a token is back: the right key works again.
    g_fake_now += 1'000'000'000;
    CHECK(attempt(IBV_WR_RDMA_WRITE, ma.rkey) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(t.a.at(ma.addr), t.b.at(mb.addr), 64) == 0);
}

namespace {

// A UD QP (qkey kQkey) of one guest, with an MR, a CQ and an AH per
// destination LID.
struct UdEnd {
    static constexpr uint32_t kQkey = 0x11111111;
    FakeProvider& p;
    uint32_t pd;
    FakeProvider::CqView cq;
    FakeProvider::QpView qp;
    FakeProvider::MrInfo mr;
    explicit UdEnd(FakeProvider& provider) : p(provider) {
        pd = p.pd();
        cq = p.cq(256);
        FakeProvider::QpSpec ud;
        ud.type = IBV_QPT_UD;
        qp = p.qp(pd, cq, cq, ud);
        p.ud_ready(qp, kQkey);
        mr = p.mr(pd, 8192, kAllAccess);
    }
    uint32_t ah(uint16_t dlid) {
        abi::CmdCreateAhReq r{};
        r.pd_handle = pd;
        r.attr.dlid = dlid;
        r.attr.port_num = 1;
        return p.cmd(CmdOp::CreateAh, r).as<abi::CmdCreateAhResp>().ah_handle;
    }
    // Posts one datagram of 8 bytes to (ah, qpn) with `qkey`.
    void send(uint32_t ah_handle, uint32_t qpn, uint32_t qkey) {
        auto w = send_wqe(qkey, IBV_WR_SEND);
        w.ah_handle = ah_handle;
        w.remote_qpn = qpn;
        w.remote_qkey = qkey;
        p.post_send(qp.sq, w, {abi::Sge{mr.addr, 8, mr.lkey}});
    }
    void post_recvs(int n) {
        for (int i = 0; i < n; ++i) p.post_recv(qp.rq, 100 + i, {abi::Sge{mr.addr + 4096, 1024, mr.lkey}});
    }
};

}  // namespace

// Guest a sends guest b's UD QP datagrams with qkey after wrong qkey. Past
// the limit every datagram of a to b is dropped unexamined, even one with
// the right qkey, while c's datagrams to b and a's to c still arrive; a
// token later one more guess is examined; a second later a's right qkey
// gets through again. With two workers a's guesses are served by b's.
TEST_CASE("a source that keeps guessing qkeys is counted and throttled", "[shim][isolation]") {
    const Workers workers = GENERATE(Workers::One, Workers::Two);
    TwoGuests t(workers);
    FakeProvider c(t.eng, t.eng.add_guest("c", 3, 0x3333));  // a's worker
    t.eng.qkey_throttle().set_limit(4);  // 4 at once, then 4 a second
    UdEnd ea(t.a), eb(t.b), ec(c);
    const uint32_t a_to_b = ea.ah(2), a_to_c = ea.ah(3), c_to_b = ec.ah(2);
    const GuestSecurity& sb = t.beng().guests().security_of(t.gb);
    eb.post_recvs(8);
    ec.post_recvs(2);
    // The senders' completions succeed whatever happens to the datagrams.
    auto sent = [&](UdEnd& e, size_t n) {
        t.run();
        auto sc = e.p.poll(e.cq);
        CHECK(sc.size() == n);
        for (auto& s : sc) CHECK(s.status == IBV_WC_SUCCESS);
    };
    auto guess = [&](int n) {
        for (int i = 0; i < n; ++i) ea.send(a_to_b, eb.qp.qpn, UdEnd::kQkey ^ uint32_t(0x1000 + i));
        sent(ea, size_t(n));
    };

    guess(10);
    guess(10);
    CHECK(sb.qkey_violations == 4);       // examined: the bucket's 4
    CHECK(sb.throttled_datagrams == 16);  // the rest: dropped unexamined
    ea.send(a_to_b, eb.qp.qpn, UdEnd::kQkey);  // the right qkey does not help
    sent(ea, 1);
    CHECK(sb.throttled_datagrams == 17);
    CHECK(eb.p.poll(eb.cq).empty());
    CHECK(t.eng.qkey_throttle().throttled(GuessThrottle::pair(1, 2), t.eng.now()));

    // Others are not affected: c to b, and a to c.
    ec.send(c_to_b, eb.qp.qpn, UdEnd::kQkey);
    sent(ec, 1);
    auto rb = eb.p.poll(eb.cq);
    REQUIRE(rb.size() == 1);
    CHECK(rb[0].status == IBV_WC_SUCCESS);
    CHECK(rb[0].slid == 3);
    ea.send(a_to_c, ec.qp.qpn, UdEnd::kQkey);
    sent(ea, 1);
    auto rc = ec.p.poll(ec.cq);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].slid == 1);

    // A quarter of a second brings one token: one more guess is examined.
    g_fake_now += 250'000'000;
    guess(10);
    CHECK(sb.qkey_violations == 5);
    CHECK(sb.throttled_datagrams == 26);
    // A second of silence: the right qkey gets through again.
    g_fake_now += 1'000'000'000;
    ea.send(a_to_b, eb.qp.qpn, UdEnd::kQkey);
    sent(ea, 1);
    rb = eb.p.poll(eb.cq);
    REQUIRE(rb.size() == 1);
    CHECK(rb[0].status == IBV_WC_SUCCESS);
    CHECK(rb[0].slid == 1);
    CHECK(sb.qkey_violations == 5);
}
