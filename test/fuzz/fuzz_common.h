// Shared pieces of the libFuzzer harnesses (docs/reliability.md). Each
// harness drives the shim core in-process, exactly as the event loop does:
// one input = guests attached over sealed memfd arenas, then a sequence of
// commands, WQEs, ring indices and doorbells read from the input.
//
// Guest "a" is the attacker (the fuzzer writes its memory), "b" a peer whose
// QPs are connected to a's and which granted one MR for remote access, "c" a
// bystander that granted nothing to a. After every input the harness checks
// that c's whole arena and b's private MR are bit for bit what they were:
// the shim must never write guest memory it was not given through a valid
// key. ASan/UBSan catch the rest (the shim's own memory).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "abi_client.h"
#include "commands.h"
#include "engine.h"
#include "secure_random.h"
#include "vrdma/abi.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::fuzz {

using namespace vrdma::shim;
// The harnesses' bodies live at global scope under `using namespace
// vrdma::fuzz`, which does not make vrdma::abi visible there.
namespace abi = vrdma::abi;
namespace abi_client = vrdma::abi_client;
using abi_client::CqView;
using abi_client::MrInfo;
using abi_client::QpView;
using abi_client::WqView;

// Reads the input front to back; past its end every value is 0.
class Input {
public:
    Input(const uint8_t* d, size_t n) : d_(d), n_(n) {}
    bool empty() const { return pos_ >= n_; }
    size_t left() const { return pos_ < n_ ? n_ - pos_ : 0; }
    uint8_t u8() { return pos_ < n_ ? d_[pos_++] : 0; }
    uint16_t u16() { return uint16_t(u8() | (uint16_t(u8()) << 8)); }
    uint32_t u32() { return uint32_t(u16()) | (uint32_t(u16()) << 16); }
    uint64_t u64() { return uint64_t(u32()) | (uint64_t(u32()) << 32); }
    void bytes(void* out, size_t len) {
        auto* o = static_cast<uint8_t*>(out);
        for (size_t i = 0; i < len; ++i) o[i] = u8();
    }
    // One of n choices (n > 0).
    uint32_t pick(uint32_t n) { return u8() % n; }

private:
    const uint8_t* d_;
    size_t n_;
    size_t pos_ = 0;
};

inline uint64_t g_now = 1'000'000'000;
inline uint64_t fake_clock() { return g_now; }

// Once per process: logs off (VRDMA_FUZZ_LOG=1: all of them), and SIGPIPE
// ignored as the shim's main() does.
inline void quiet_logs() {
    static bool done = (set_log_level(getenv("VRDMA_FUZZ_LOG") ? LogLevel::Debug : LogLevel::Error),
                        signal(SIGPIPE, SIG_IGN), true);
    (void)done;
}

[[noreturn]] inline void violation(const char* what) {
    std::fprintf(stderr, "INVARIANT VIOLATED: %s\n", what);
    std::abort();
}

inline uint64_t fnv(const uint8_t* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// One attached process, as the provider sees its memory: the shared ABI
// client (test/common/abi_client.h) run in-process. Setup that the shim
// refuses aborts: the harness is wrong then.
class Guest : public abi_client::Client {
public:
    static constexpr uint64_t kArena = 1 << 20;

    Guest(Engine& eng, const GuestIdentity& g) : Client(abi_client::in_process(eng)), eng_(eng) {
        if (!arena().open(kArena, F_SEAL_SHRINK, "fuzz-arena")) std::abort();
        Context* c = abi_client::attach_in_process(eng, g, *this);
        if (!c) std::abort();
        ctx_id_ = c->id();
    }

    Context* ctx() { return eng_.find_context(ctx_id_); }
    bool alive() {
        Context* c = ctx();
        return c && !c->dead;
    }
    uint64_t ctx_id() const { return ctx_id_; }

    uint64_t alloc(uint64_t bytes, uint64_t align = 64) {
        uint64_t g = Client::alloc(bytes, align);
        if (!g) std::abort();  // the harness's own layout
        return g;
    }
    void set_cmd_producer(uint32_t v) { cmd_producer() = v; }

    // --- resources (setup; abort on failure: the harness is wrong then) ---
    uint32_t pd() {
        uint32_t h = 0;
        must(alloc_pd(h));
        return h;
    }
    MrInfo mr(uint32_t pd, uint64_t len, uint32_t access, uint8_t fill) {
        uint64_t addr = alloc(len, 4096);
        std::memset(at(addr), fill, len);
        MrInfo m;
        must(reg_mr(pd, addr, len, access, m));
        return m;
    }
    CqView cq(uint32_t entries) {
        CqView v;
        must(create_cq(entries, v));
        return v;
    }
    QpView qp(uint32_t pd, const CqView& scq, const CqView& rcq, uint32_t type, uint32_t srq_handle = 0) {
        abi_client::QpSpec s;
        s.type = type;
        s.entries = 8;
        s.stride = 512;
        s.rq_stride = 128;
        s.srq = srq_handle;
        s.user_handle = 0;
        QpView v;
        must(create_qp(pd, scq.handle, rcq.handle, s, v));
        return v;
    }
    WqView srq_ring;
    uint32_t srq(uint32_t pd) {
        uint32_t h = 0;
        must(create_srq(pd, 8, 128, 4, srq_ring, h));
        return h;
    }
    int modify(uint32_t qp, uint32_t mask, const abi::QpAttr& a) { return modify_qp(qp, mask, a); }
    // RESET -> INIT -> RTR -> RTS (RC to (dlid, dqpn); UD with qkey).
    int connect(const QpView& q, uint16_t dlid, uint32_t dqpn, uint32_t qkey, uint8_t retry = 2) {
        if (q.type == IBV_QPT_UD) return connect_ud(q.handle, qkey);
        abi_client::RcPath p;
        p.dlid = dlid;
        p.dqpn = dqpn;
        p.retry_cnt = p.rnr_retry = retry;
        return connect_rc(q.handle, p);
    }
    uint32_t ah(uint32_t pd, uint16_t dlid) {
        uint32_t h = 0;
        must(create_ah(pd, dlid, h));
        return h;
    }

    static void must(int status) {
        if (status != 0) {
            std::fprintf(stderr, "fuzz setup: command failed with %d\n", status);
            std::abort();
        }
    }

private:
    Engine& eng_;
    uint64_t ctx_id_ = 0;
};

// Three guests with connected QPs and registered memory (see the top).
struct World {
    Engine eng;
    const GuestIdentity& ga;
    const GuestIdentity& gb;
    const GuestIdentity& gc;
    Guest a, b, c;

    uint32_t a_pd = 0, b_pd = 0, c_pd = 0;
    MrInfo a_local, a_remote, b_granted, b_private, c_mr;
    CqView a_cq, a_cq2, b_cq, c_cq;
    QpView a_rc, a_loop, a_ud, a_srq_qp, b_rc, b_rc2, b_ud, c_rc;
    uint32_t a_srq = 0, a_ah_b = 0, a_ah_c = 0;
    // Memory windows: a's of types 1 and 2 (their rkeys as a last bound
    // them, successfully or not), and an unbound type 2 window of b.
    uint32_t a_mw[2] = {}, a_mw_key[2] = {}, b_mw_key = 0;
    uint64_t c_hash = 0, b_private_hash = 0;
    bool b_gone = false;

    World()
        : ga(eng.add_guest("a", 1, 0x1111)),
          gb(eng.add_guest("b", 2, 0x2222)),
          gc(eng.add_guest("c", 3, 0x3333)),
          a(eng, ga),
          b(eng, gb),
          c(eng, gc) {
        secure_random_make_predictable(1);  // the same QPNs and keys in every input (seeds name them)
        eng.set_clock(fake_clock);
        constexpr uint32_t kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC;
        a_pd = a.pd();
        b_pd = b.pd();
        c_pd = c.pd();
        a_local = a.mr(a_pd, 3 * 4096, IBV_ACCESS_LOCAL_WRITE, 0xa1);
        a_remote = a.mr(a_pd, 2 * 4096, kAll | IBV_ACCESS_MW_BIND, 0xa2);
        b_granted = b.mr(b_pd, 2 * 4096, kAll, 0xb1);
        b_private = b.mr(b_pd, 4096, IBV_ACCESS_LOCAL_WRITE, 0xb2);
        c_mr = c.mr(c_pd, 4096, kAll, 0xc1);
        a_cq = a.cq(16);
        a_cq2 = a.cq(8);
        b_cq = b.cq(64);
        c_cq = c.cq(8);
        a_srq = a.srq(a_pd);
        a_rc = a.qp(a_pd, a_cq, a_cq2, IBV_QPT_RC);
        a_loop = a.qp(a_pd, a_cq, a_cq, IBV_QPT_RC);
        a_ud = a.qp(a_pd, a_cq, a_cq2, IBV_QPT_UD);
        a_srq_qp = a.qp(a_pd, a_cq2, a_cq2, IBV_QPT_RC, a_srq);
        b_rc = b.qp(b_pd, b_cq, b_cq, IBV_QPT_RC);
        b_rc2 = b.qp(b_pd, b_cq, b_cq, IBV_QPT_RC);
        b_ud = b.qp(b_pd, b_cq, b_cq, IBV_QPT_UD);
        c_rc = c.qp(c_pd, c_cq, c_cq, IBV_QPT_RC);
        if (a.connect(a_rc, 2, b_rc.qpn, 0) || b.connect(b_rc, 1, a_rc.qpn, 0) ||
            a.connect(a_loop, 1, a_loop.qpn, 0) || a.connect(a_ud, 0, 0, 0x1111) ||
            a.connect(a_srq_qp, 2, b_rc2.qpn, 0) || b.connect(b_rc2, 1, a_srq_qp.qpn, 0) ||
            b.connect(b_ud, 0, 0, 0x2222) || c.connect(c_rc, 3, 0x777777, 0))
            std::abort();
        a_ah_b = a.ah(a_pd, 2);
        a_ah_c = a.ah(a_pd, 3);
        for (uint32_t i = 0; i < 2; ++i) {
            auto r = a.cmd(abi::CmdOp::AllocMw, abi::CmdAllocMwReq{a_pd, i + 1});
            if (r.status) std::abort();
            a_mw[i] = r.as<abi::CmdAllocMwResp>().mw_handle;
            a_mw_key[i] = r.as<abi::CmdAllocMwResp>().rkey;
        }
        auto bw = b.cmd(abi::CmdOp::AllocMw, abi::CmdAllocMwReq{b_pd, IBV_MW_TYPE_2});
        if (bw.status) std::abort();
        b_mw_key = bw.as<abi::CmdAllocMwResp>().rkey;
        // b posts receives into the MR it granted (its private one stays
        // untouched by anyone but b).
        for (int i = 0; i < 4; ++i) {
            b.post_recv(b_rc.rq, 100 + i, {abi::Sge{b_granted.addr, 4096, b_granted.lkey}});
            b.post_recv(b_ud.rq, 200 + i, {abi::Sge{b_granted.addr + 4096, 4096, b_granted.lkey}});
        }
        eng.poll_once();
        snapshot();
    }

    void snapshot() {
        c_hash = fnv(c.base() + abi::kControlBlockBytes, Guest::kArena - abi::kControlBlockBytes);
        b_private_hash = fnv(b.at(b_private.addr), b_private.len);
    }
    void check() {
        if (fnv(c.base() + abi::kControlBlockBytes, Guest::kArena - abi::kControlBlockBytes) != c_hash)
            violation("guest c's memory changed: c granted nothing to a");
        if (fnv(b.at(b_private.addr), b_private.len) != b_private_hash)
            violation("guest b's private MR changed: b granted it to no one");
    }
    void run(int passes) {
        for (int i = 0; i < passes; ++i) {
            eng.poll_once();
            // What the daemon's reap_dead_contexts does.
            for (uint64_t id : eng.dead_contexts()) eng.detach(id);
        }
    }

    // Key, address and QPN choices the fuzzer picks among.
    uint32_t key(Input& in) {
        switch (in.pick(12)) {
        case 9: return a_mw_key[0];
        case 10: return a_mw_key[1];
        case 11: return b_mw_key;
        case 0: return a_local.lkey;
        case 1: return a_remote.lkey;
        case 2: return b_granted.lkey;
        case 3: return b_private.lkey;
        case 4: return c_mr.lkey;
        case 5: return a_local.lkey + in.u8();
        case 6: return make_handle(HandleType::Mr, in.u8(), in.u8());
        case 7: return 0;
        default: return in.u32();
        }
    }
    uint64_t addr(Input& in) {
        uint64_t base;
        switch (in.pick(8)) {
        case 0: base = a_local.addr; break;
        case 1: base = a_remote.addr; break;
        case 2: base = b_granted.addr; break;
        case 3: base = b_private.addr; break;
        case 4: base = c_mr.addr; break;
        case 5: base = a.gva(); break;
        case 6: return in.u64();
        default: base = a_local.addr + a_local.len; break;
        }
        int32_t delta = int32_t(in.u16()) - 0x8000;
        if (in.u8() & 1) delta *= 16;
        return base + int64_t(delta);
    }
    uint32_t length(Input& in) {
        switch (in.pick(6)) {
        case 0: return 0;
        case 1: return 8;
        case 2: return in.u8();
        case 3: return in.u16();
        case 4: return 0xffffffffu - in.u8();
        default: return in.u32();
        }
    }
    uint32_t qpn(Input& in) {
        switch (in.pick(7)) {
        case 0: return b_rc.qpn;
        case 1: return b_ud.qpn;
        case 2: return c_rc.qpn;
        case 3: return a_ud.qpn;
        case 4: return a_loop.qpn;
        case 5: return in.u8();
        default: return in.u32();
        }
    }
    QpView* a_qp(Input& in) {
        switch (in.pick(4)) {
        case 0: return &a_rc;
        case 1: return &a_loop;
        case 2: return &a_ud;
        default: return &a_srq_qp;
        }
    }
    uint32_t opcode(Input& in) {
        static constexpr uint32_t kOps[] = {IBV_WR_SEND,         IBV_WR_SEND_WITH_IMM,         IBV_WR_RDMA_WRITE,
                                            IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ,
                                            IBV_WR_ATOMIC_CMP_AND_SWP,  IBV_WR_ATOMIC_FETCH_AND_ADD,
                                            IBV_WR_BIND_MW,      IBV_WR_LOCAL_INV,             IBV_WR_SEND_WITH_INV};
        constexpr uint32_t kN = sizeof(kOps) / sizeof(kOps[0]);
        uint8_t v = in.u8();
        return v < 224 ? kOps[v % kN] : (v & 1 ? in.u32() : uint32_t(v - 224));
    }

    // Writes a send WQE built from the input at the producer slot of q and
    // publishes it.
    void post_send(Input& in, QpView& q) {
        abi::SendWqe w{};
        w.wr_id = in.u32();
        w.opcode = opcode(in);
        uint8_t f = in.u8();
        w.send_flags = (f & 1 ? IBV_SEND_SIGNALED : 0) | (f & 2 ? IBV_SEND_INLINE : 0) |
                       (f & 4 ? IBV_SEND_SOLICITED : 0) | (f & 8 ? IBV_SEND_FENCE : 0) |
                       (f == 0xff ? in.u32() : 0);
        w.imm_data = in.u32();
        uint8_t ns = in.u8();
        w.num_sge = ns < 200 ? ns % 5 : (ns < 250 ? ns : in.u32());
        uint16_t il = in.u16();
        w.inline_len = il < 0xff00 ? il % 300 : in.u32();
        w.remote_addr = addr(in);
        w.rkey = key(in);
        w.compare_add = in.u64();
        w.swap = in.u64();
        uint8_t ahc = in.u8();
        w.ah_handle = ahc % 4 == 0 ? a_ah_b : ahc % 4 == 1 ? a_ah_c : ahc % 4 == 2 ? make_handle(HandleType::Ah, 0, ahc) : in.u32();
        w.remote_qpn = qpn(in);
        uint8_t qk = in.u8();
        w.remote_qkey = qk % 3 == 0 ? 0x2222 : qk % 3 == 1 ? 0x80000000u : in.u32();
        if (w.opcode == IBV_WR_BIND_MW) {  // one of a's windows (or a guess) over any key's memory
            uint8_t m = in.u8();
            const uint32_t i = m & 1;
            w.mw_handle = m < 240 ? a_mw[i] : in.u32();
            w.rkey = m & 2 ? (a_mw_key[i] & ~0xffu) | uint8_t(a_mw_key[i] + 1) : key(in);
            w.mr_lkey = key(in);
            w.mw_access = m & 4 ? in.u32() : (in.u8() & 0xe);
            w.compare_add = length(in);
            if (m < 240) a_mw_key[i] = w.rkey;
        }
        const uint32_t room = q.sq.stride - uint32_t(sizeof(w));
        std::vector<uint8_t> inline_data;
        std::vector<abi::Sge> sges;
        if (w.send_flags & IBV_SEND_INLINE) {
            inline_data.resize(std::min<uint32_t>(in.u8(), room));
            in.bytes(inline_data.data(), inline_data.size());
        } else {
            uint32_t n = std::min<uint32_t>(w.num_sge, room / sizeof(abi::Sge));
            for (uint32_t i = 0; i < n; ++i) sges.push_back(abi::Sge{addr(in), length(in), key(in)});
        }
        a.post_send(q.sq, w, sges, inline_data);
    }
    // A receive WQE into a's own receive queues (its RC loopback QP, its
    // UD QP, its SRQ) or b's (b is allowed to hurt itself only).
    void post_recv(Input& in) {
        Guest* g = &a;
        WqView* wq;
        switch (in.pick(4)) {
        case 0: wq = &a_loop.rq; break;
        case 1: wq = &a_ud.rq; break;
        case 2: wq = &a.srq_ring; break;
        default:
            if (b_gone) return;
            g = &b;
            wq = &b_rc.rq;
            break;
        }
        abi::RecvWqe h{in.u32(), 0, 0};
        uint8_t ns = in.u8();
        h.num_sge = ns < 240 ? ns % 5 : in.u32();
        uint32_t n = std::min<uint32_t>(h.num_sge, (wq->stride - sizeof(h)) / sizeof(abi::Sge));
        std::vector<abi::Sge> sges;
        for (uint32_t i = 0; i < n; ++i) {
            if (g == &b) {
                sges.push_back(abi::Sge{b_granted.addr + in.u8(), uint32_t(in.u8()) * 16, b_granted.lkey});
            } else {
                sges.push_back(abi::Sge{addr(in), length(in), key(in)});
            }
        }
        g->post_recv(*wq, h, sges);
    }
    void poll_all(Input& in) {
        uint32_t m = in.u8();
        a.poll_cq(a_cq, m);
        a.poll_cq(a_cq2, m);
        if (!b_gone) b.poll_cq(b_cq, 64);
    }
};

}  // namespace vrdma::fuzz
