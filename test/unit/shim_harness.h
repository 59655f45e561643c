// In-process harness for the shim's unit tests: a "provider" that maps the
// same memfd arena as the shim's context, writes commands and WQEs into it
// through the shared ABI client (test/common/abi_client.h), and runs the
// engine one pass at a time.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "abi_client.h"
#include "engine.h"
#include "fabric_test_util.h"
#include "worker_link.h"
#include "vrdma/abi.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::shim::test {

// Engine logs below warnings would drown the test output.
inline const bool g_quiet_logs = (set_log_level(LogLevel::Warn), true);

inline uint64_t g_fake_now = 1'000'000'000;
inline uint64_t fake_clock() { return g_fake_now; }

// Every access an MR or a QP can give, atomics included.
inline constexpr uint32_t kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

using abi_client::CmdResult;
using abi_client::QpSpec;  // the defaults: RC, 16 entries, SQ stride 1024, RQ stride 256, 4 SGEs, 256 inline

// Memory of one attached process as the provider sees it: the shared ABI
// client (test/common/abi_client.h) run in-process, whose setup helpers
// throw when the shim refuses (a test that expects a refusal uses cmd()).
class FakeProvider : public abi_client::Client {
public:
    static constexpr uint64_t kArenaLen = 8 << 20;
    using CqView = abi_client::CqView;
    using WqView = abi_client::WqView;
    using QpView = abi_client::QpView;
    using MrInfo = abi_client::MrInfo;
    using QpSpec = abi_client::QpSpec;

    FakeProvider(Engine& eng, const GuestIdentity& guest) : Client(abi_client::in_process(eng)) {
        if (!arena().open(kArenaLen)) throw std::runtime_error("memfd arena");
        ctx_ = abi_client::attach_in_process(eng, guest, *this);
        if (!ctx_) throw std::runtime_error("attach");
        ctx_id_ = ctx_->id();
    }

    Context& ctx() { return *ctx_; }
    uint64_t ctx_id() const { return ctx_id_; }
    int fd() { return arena().fd(); }
    uint64_t alloc(uint64_t bytes, uint64_t align = 64) {
        uint64_t g = Client::alloc(bytes, align);
        if (!g) throw std::runtime_error("arena full");
        return g;
    }
    void doorbell() { cb()->doorbell.fetch_add(1); }

    // Issues one command and runs the engine once; throws when that pass
    // did not complete it.
    template <typename Req>
    CmdResult cmd(abi::CmdOp op, const Req& req) {
        return done(Client::cmd(op, req));
    }
    CmdResult cmd(abi::CmdOp op) { return done(Client::cmd(op)); }
    CmdResult cmd_raw(abi::CmdOp op, const uint8_t* raw) {
        return done(Client::cmd_raw(uint32_t(op), raw, abi::kCmdReqBytes));
    }

    // --- resources -------------------------------------------------------
    uint32_t pd() {
        uint32_t h = 0;
        check(alloc_pd(h), "alloc_pd");
        return h;
    }
    MrInfo mr(uint32_t pd, uint64_t len, uint32_t access) {
        MrInfo m;
        check(reg_mr(pd, alloc(len, 4096), len, access, m), "reg_mr");
        return m;
    }
    CqView cq(uint32_t entries) {
        CqView v;
        check(create_cq(entries, v, 0xc0ffee), "create_cq");
        return v;
    }
    // Polls up to max CQEs (the consumer side of the CQ ring).
    std::vector<abi::Cqe> poll(CqView& cq, uint32_t max = 1024) {
        std::vector<abi::Cqe> out;
        poll_cq(cq, max, &out);
        return out;
    }
    abi::CmdCreateQpReq qp_req(uint32_t pd, const CqView& scq, const CqView& rcq, const QpSpec& s, QpView& v) {
        return qp_request(pd, scq.handle, rcq.handle, s, v);
    }
    QpView qp(uint32_t pd, const CqView& scq, const CqView& rcq, QpSpec s = {}) {
        QpView v;
        check(create_qp(pd, scq.handle, rcq.handle, s, v), "create_qp");
        return v;
    }
    int modify(uint32_t qp, uint32_t mask, const abi::QpAttr& a) {
        int st = modify_qp(qp, mask, a);
        if (st < 0) throw std::runtime_error("command not done");
        return st;
    }
    // RESET -> INIT -> RTR -> RTS for an RC QP connected to (dlid, dqpn).
    void connect_rc(const QpView& q, uint16_t dlid, uint32_t dqpn, uint32_t access, uint8_t rnr_retry = 7,
                    uint8_t retry_cnt = 7, uint8_t min_rnr = 12) {
        abi_client::RcPath p;
        p.dlid = dlid;
        p.dqpn = dqpn;
        p.access = access;
        p.sl = 3;
        p.min_rnr_timer = min_rnr;
        p.timeout = 14;
        p.retry_cnt = retry_cnt;
        p.rnr_retry = rnr_retry;
        check(Client::connect_rc(q.handle, p), "connect_rc");
    }
    void ud_ready(const QpView& q, uint32_t qkey) { check(connect_ud(q.handle, qkey), "UD to RTS"); }
    uint32_t qp_state(uint32_t qp) {
        return cmd(abi::CmdOp::QueryQp, abi::CmdHandleReq{qp}).as<abi::CmdQueryQpResp>().attr.qp_state;
    }

    // --- posting ---------------------------------------------------------
    // num_sge 0 in hdr: the number of SGEs given. Inline data: inline_len bytes.
    void post_send(WqView& wq, const abi::SendWqe& hdr, std::vector<abi::Sge> sges = {},
                   const void* inline_data = nullptr) {
        abi::SendWqe h = hdr;
        if (inline_data) {
            Client::post_send(wq, h, {}, {static_cast<const uint8_t*>(inline_data), h.inline_len});
            return;
        }
        if (h.num_sge == 0) h.num_sge = uint32_t(sges.size());
        Client::post_send(wq, h, sges);
    }
    void post_recv(WqView& wq, uint64_t wr_id, std::vector<abi::Sge> sges) { Client::post_recv(wq, wr_id, sges); }

private:
    static CmdResult done(CmdResult r) {
        if (!r.done()) throw std::runtime_error("command not done");
        return r;
    }
    static void check(int status, const char* what) {
        if (status) throw std::runtime_error(std::string(what) + " " + std::to_string(status));
    }

    Context* ctx_ = nullptr;
    uint64_t ctx_id_ = 0;
};

inline abi::SendWqe send_wqe(uint64_t wr_id, uint32_t opcode, uint32_t flags = IBV_SEND_SIGNALED) {
    abi::SendWqe w{};
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.send_flags = flags;
    return w;
}

// Where the two guests of TwoGuests are served: by one engine (one
// worker), or guest a by one and guest b by another, joined by worker
// links (worker_link.h) as two workers of a shim are (Two), or by a pair
// of fabric links over a socketpair, TLS and encrypted frames, as two shims
// are (Fabric). Each transport's cases run over all three:
// GENERATE(Workers::One, Workers::Two, Workers::Fabric).
enum class Workers { One, Two, Fabric };

inline const char* workers_name(Workers w) {
    return w == Workers::One ? "one worker" : w == Workers::Two ? "two workers" : "two shims (fabric)";
}

// Two engines joined as two shims of a fabric are: a Link each over a
// socketpair (test/common/fabric_test_util.h), LID 1 on one side, 2 on the
// other. pump() moves what either link has, both ways.
struct FabricJoin {
    fabric::TlsContext tls_a, tls_b;
    fabric_test::LinkTransport to_b, to_a;  // a's route to b, b's to a
    std::unique_ptr<fabric::Link> la, lb;
    FabricJoin(Engine& ea, Engine& eb) {
        if (!fabric_test::make_tls(tls_a, "the key of TwoGuests") || !fabric_test::make_tls(tls_b, "the key of TwoGuests"))
            throw std::runtime_error("fabric key");
        int fds[2];
        if (!fabric_test::socket_pair(fds)) throw std::runtime_error("socketpair");
        la = std::make_unique<fabric::Link>(ea, tls_a, UniqueFd(fds[0]), true, fabric_test::instance(0xa), 1, 1, 0,
                                            "shim-b");
        lb = std::make_unique<fabric::Link>(eb, tls_b, UniqueFd(fds[1]), false, fabric_test::instance(0xb), 2, 2, 0,
                                            "shim-a");
        to_b.link = la.get();
        to_a.link = lb.get();
        ea.routes().add(2, 2, &to_b);
        eb.routes().add(1, 1, &to_a);
        to_b.routed_in = &ea;
        to_a.routed_in = &eb;
        for (int i = 0; i < 1000 && !(up(*la) && up(*lb)); ++i) pump();
        if (!up(*la) || !up(*lb)) throw std::runtime_error("the fabric links did not come up");
    }
    ~FabricJoin() {
        to_b.link = to_a.link = nullptr;
    }
    static bool up(const fabric::Link& l) { return l.state() == fabric::LinkState::Up; }
    // One round of both links: what is queued goes out, what arrived is
    // handled (a long message takes several rounds).
    void pump() {
        for (fabric::Link* l : {la.get(), lb.get()}) {
            if (l->state() == fabric::LinkState::Closed) continue;
            l->flush();
            if (l->state() != fabric::LinkState::Closed) l->on_readable();
            l->take_became_up();
        }
    }
};

// Two guests (LIDs 1 and 2) with the fake clock, on one worker or two. The
// two workers' engines run in turns on the test's thread: a pass of a's
// engine, then b's worker receives, a pass of b's, then a's receives.
struct TwoGuests {
    SharedTables shared;
    Engine eng{Quotas{}, &shared};   // guest a's (and b's, with one worker)
    Engine eng2{Quotas{}, &shared};  // guest b's with two workers
    const bool two;
    const GuestIdentity& ga;
    const GuestIdentity& gb;
    FakeProvider a, b;
    WorkerInbox inbox_a, inbox_b;  // of a's worker (0) and b's (1)
    std::unique_ptr<WorkerLink> link_ab, link_ba;
    std::unique_ptr<FabricJoin> fabric;  // Workers::Fabric
    explicit TwoGuests(Workers w = Workers::One)
        : two(w != Workers::One),
          ga(eng.add_guest("a", 1, 0x1111)),
          gb((two ? eng2 : eng).add_guest("b", 2, 0x2222)),
          a(eng, ga),
          b(two ? eng2 : eng, gb) {
        eng.set_clock(fake_clock);
        eng2.set_clock(fake_clock);
        if (w == Workers::Fabric) fabric = std::make_unique<FabricJoin>(eng, eng2);
        if (w != Workers::Two) return;
        link_ab = std::make_unique<WorkerLink>(eng, 0, 1, inbox_b);
        link_ba = std::make_unique<WorkerLink>(eng2, 1, 0, inbox_a);
        eng.routes().add(2, 2, link_ab.get());
        eng2.routes().add(1, 1, link_ba.get());
    }
    ~TwoGuests() {
        // The links hold pins of both guests: they go first.
        fabric.reset();
        if (!link_ab) return;
        eng.routes().remove(link_ab.get());
        eng2.routes().remove(link_ba.get());
        for (WorkerInbox* in : {&inbox_a, &inbox_b})
            while (WorkerMsg* m = in->ring.front()) {
                m->pins.clear();
                in->ring.pop();
            }
        link_ab.reset();
        link_ba.reset();
    }
    // The engine that serves guest b.
    Engine& beng() { return two ? eng2 : eng; }
    // What the other worker sent each worker, all of it.
    void receive() {
        if (fabric) {
            for (int i = 0; i < 8; ++i) fabric->pump();
            return;
        }
        if (!two) return;
        WorkerLink* to_a[2] = {nullptr, link_ab.get()};
        WorkerLink* to_b[2] = {link_ba.get(), nullptr};
        link_ab->flush();
        link_ba->flush();
        receive_messages(inbox_b, to_b, 2, UINT64_MAX);
        receive_messages(inbox_a, to_a, 2, UINT64_MAX);
    }
    void run(int passes = 4) {
        for (int i = 0; i < passes; ++i) {
            eng.poll_once();
            receive();
            if (two) eng2.poll_once();
            receive();
        }
    }
};

}  // namespace vrdma::shim::test
