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
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "commands.h"
#include "engine.h"
#include "vrdma/abi.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::fuzz {

using namespace vrdma::shim;
// The harnesses' bodies live at global scope under `using namespace
// vrdma::fuzz`, which does not make vrdma::abi visible there.
namespace abi = vrdma::abi;

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

// One attached process, as the provider sees its memory.
class Guest {
public:
    static constexpr uint64_t kArena = 1 << 20;

    Guest(Engine& eng, const GuestIdentity& g) : eng_(eng) {
        fd_ = memfd_create("fuzz-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd_ < 0 || ftruncate(fd_, kArena) != 0 || fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK) != 0) std::abort();
        void* p = mmap(nullptr, kArena, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
        if (p == MAP_FAILED) std::abort();
        base_ = static_cast<uint8_t*>(p);
        int err = 0;
        Context* c = eng.attach(g, UniqueFd(dup(fd_)), gva(), kArena, UniqueFd(), UniqueFd(), UniqueFd(), err);
        if (!c) std::abort();
        ctx_id_ = c->id();
        next_ = abi::kControlBlockBytes;
    }
    ~Guest() {
        munmap(base_, kArena);
        close(fd_);
    }
    Guest(const Guest&) = delete;
    Guest& operator=(const Guest&) = delete;

    uint64_t gva() const { return reinterpret_cast<uint64_t>(base_); }
    uint8_t* at(uint64_t g) { return reinterpret_cast<uint8_t*>(g); }
    uint8_t* base() { return base_; }
    abi::ControlBlock* cb() { return reinterpret_cast<abi::ControlBlock*>(base_); }
    Context* ctx() { return eng_.find_context(ctx_id_); }
    bool alive() {
        Context* c = ctx();
        return c && !c->dead;
    }
    uint64_t ctx_id() const { return ctx_id_; }

    uint64_t alloc(uint64_t bytes, uint64_t align = 64) {
        next_ = (next_ + align - 1) & ~(align - 1);
        if (next_ + bytes > kArena) std::abort();  // the harness's own layout
        uint64_t g = gva() + next_;
        next_ += bytes;
        return g;
    }

    struct Result {
        int status = -1;
        alignas(8) uint8_t resp[abi::kCmdRespBytes] = {};
        template <typename T>
        T as() const {
            T t;
            std::memcpy(&t, resp, sizeof(T));
            return t;
        }
    };

    // Writes up to kCmdSlots command records, advances the producer by
    // `advance` (normally n), rings the doorbell and runs one engine pass.
    // Returns the results of the records the shim completed.
    std::vector<Result> cmds(const std::vector<std::pair<uint32_t, std::vector<uint8_t>>>& recs, uint32_t advance) {
        std::vector<Result> out;
        std::vector<uint32_t> seqs, slots;
        for (size_t i = 0; i < recs.size(); ++i) {
            uint32_t slot = ring_slot(ring_advance(prod_, uint32_t(i), abi::kCmdSlots), abi::kCmdSlots);
            abi::CmdSlot& s = cb()->cmd[slot];
            uint32_t op = recs[i].first;
            std::memcpy(&s.op, &op, 4);
            std::memset(s.req, 0, sizeof(s.req));
            if (!recs[i].second.empty())  // data() of an empty vector may be null
                std::memcpy(s.req, recs[i].second.data(), std::min(recs[i].second.size(), sizeof(s.req)));
            s.seq.store(++seq_);
            seqs.push_back(seq_);
            slots.push_back(slot);
        }
        prod_ = ring_advance(prod_, advance, abi::kCmdSlots);
        cb()->cmd_producer.store(prod_);
        cb()->doorbell.fetch_add(1);
        eng_.poll_once();
        for (size_t i = 0; i < recs.size(); ++i) {
            abi::CmdSlot& s = cb()->cmd[slots[i]];
            Result r;
            if (s.done_seq.load() == seqs[i]) {
                r.status = s.status;
                std::memcpy(r.resp, s.resp, sizeof(r.resp));
            }
            out.push_back(r);
        }
        return out;
    }
    template <typename Req>
    Result cmd(abi::CmdOp op, const Req& req) {
        std::vector<uint8_t> raw(sizeof(Req));
        std::memcpy(raw.data(), &req, sizeof(Req));
        return cmds({{uint32_t(op), raw}}, 1)[0];
    }
    Result cmd(abi::CmdOp op) { return cmds({{uint32_t(op), {}}}, 1)[0]; }
    void set_cmd_producer(uint32_t v) { prod_ = v; }
    uint32_t cmd_producer() const { return prod_; }

    // --- resources (setup; abort on failure: the harness is wrong then) ---
    uint32_t pd() { return must(cmd(abi::CmdOp::AllocPd)).as<abi::CmdAllocPdResp>().pd_handle; }
    struct MrInfo {
        uint32_t handle = 0, key = 0;
        uint64_t addr = 0, len = 0;
    };
    MrInfo mr(uint32_t pd, uint64_t len, uint32_t access, uint8_t fill) {
        uint64_t addr = alloc(len, 4096);
        std::memset(at(addr), fill, len);
        auto r = must(cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd, access, addr, len})).as<abi::CmdRegMrResp>();
        return MrInfo{r.mr_handle, r.lkey, addr, len};
    }
    struct CqView {
        uint32_t handle = 0, entries = 0, cons = 0;
        uint64_t ring = 0;
    };
    CqView cq(uint32_t entries) {
        CqView v;
        v.entries = entries;
        v.ring = alloc(abi::cq_ring_bytes(entries));
        abi::CmdCreateCqReq req{};
        req.ring_gva = v.ring;
        req.entries = entries;
        v.handle = must(cmd(abi::CmdOp::CreateCq, req)).as<abi::CmdCreateCqResp>().cq_handle;
        return v;
    }
    // Consumes up to `max` CQEs as the provider does.
    uint32_t poll(CqView& cq, uint32_t max) {
        auto* hdr = reinterpret_cast<abi::RingHeader*>(at(cq.ring));
        uint32_t n = 0;
        while (n < max && hdr->producer.load() != cq.cons) {
            cq.cons = ring_next(cq.cons, cq.entries);
            hdr->consumer.store(cq.cons);
            ++n;
        }
        return n;
    }
    struct WqView {
        uint64_t ring = 0;
        uint32_t entries = 0, stride = 0, prod = 0;
        abi::RingHeader* hdr(Guest& g) const { return reinterpret_cast<abi::RingHeader*>(g.at(ring)); }
        uint8_t* slot(Guest& g, uint32_t idx) const {
            return g.at(ring + abi::wq_slots_offset() + uint64_t(ring_slot(idx, entries)) * stride);
        }
    };
    struct QpView {
        uint32_t handle = 0, qpn = 0, type = IBV_QPT_RC;
        WqView sq, rq;
        bool srq = false;
    };
    QpView qp(uint32_t pd, const CqView& scq, const CqView& rcq, uint32_t type, uint32_t srq_handle = 0) {
        QpView v;
        v.type = type;
        v.srq = srq_handle != 0;
        abi::CmdCreateQpReq req{};
        v.sq = WqView{alloc(abi::wq_ring_bytes(8, 512)), 8, 512, 0};
        if (!srq_handle) v.rq = WqView{alloc(abi::wq_ring_bytes(8, 128)), 8, 128, 0};
        req.sq_gva = v.sq.ring;
        req.rq_gva = srq_handle ? 0 : v.rq.ring;
        req.pd_handle = pd;
        req.qp_type = type;
        req.send_cq_handle = scq.handle;
        req.recv_cq_handle = rcq.handle;
        req.srq_handle = srq_handle;
        req.sq_entries = 8;
        req.sq_stride = 512;
        req.rq_entries = srq_handle ? 0 : 8;
        req.rq_stride = srq_handle ? 0 : 128;
        req.max_send_sge = 4;
        req.max_recv_sge = srq_handle ? 0 : 4;
        req.max_inline_data = 256;
        auto r = must(cmd(abi::CmdOp::CreateQp, req)).as<abi::CmdCreateQpResp>();
        v.handle = r.qp_handle;
        v.qpn = r.qpn;
        return v;
    }
    WqView srq_ring;
    uint32_t srq(uint32_t pd) {
        srq_ring = WqView{alloc(abi::wq_ring_bytes(8, 128)), 8, 128, 0};
        abi::CmdCreateSrqReq req{};
        req.ring_gva = srq_ring.ring;
        req.pd_handle = pd;
        req.entries = 8;
        req.stride = 128;
        req.max_sge = 4;
        return must(cmd(abi::CmdOp::CreateSrq, req)).as<abi::CmdCreateSrqResp>().srq_handle;
    }
    int modify(uint32_t qp, uint32_t mask, const abi::QpAttr& a) {
        abi::CmdModifyQpReq req{};
        req.qp_handle = qp;
        req.attr_mask = mask;
        req.attr = a;
        return cmd(abi::CmdOp::ModifyQp, req).status;
    }
    // RESET -> INIT -> RTR -> RTS (RC to (dlid, dqpn); UD with qkey).
    int connect(const QpView& q, uint16_t dlid, uint32_t dqpn, uint32_t qkey, uint8_t retry = 2) {
        abi::QpAttr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        int rc;
        if (q.type == IBV_QPT_UD) {
            a.qkey = qkey;
            if ((rc = modify(q.handle, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, a))) return rc;
            a = {};
            a.qp_state = IBV_QPS_RTR;
            if ((rc = modify(q.handle, IBV_QP_STATE, a))) return rc;
            a.qp_state = IBV_QPS_RTS;
            return modify(q.handle, IBV_QP_STATE | IBV_QP_SQ_PSN, a);
        }
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            IBV_ACCESS_REMOTE_ATOMIC;
        if ((rc = modify(q.handle, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, a)))
            return rc;
        a = {};
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_4096;
        a.dest_qp_num = dqpn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 1;
        a.ah.dlid = dlid;
        a.ah.port_num = 1;
        if ((rc = modify(q.handle, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                         a)))
            return rc;
        a = {};
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 1;
        a.retry_cnt = retry;
        a.rnr_retry = retry;
        a.max_rd_atomic = 1;
        return modify(q.handle, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                      a);
    }
    uint32_t ah(uint32_t pd, uint16_t dlid) {
        abi::CmdCreateAhReq req{};
        req.pd_handle = pd;
        req.attr.dlid = dlid;
        req.attr.port_num = 1;
        return must(cmd(abi::CmdOp::CreateAh, req)).as<abi::CmdCreateAhResp>().ah_handle;
    }
    // Publishes a WQE already written at the producer slot.
    void advance(WqView& wq, uint32_t n = 1) {
        wq.prod = ring_advance(wq.prod, n, wq.entries);
        wq.hdr(*this)->producer.store(wq.prod);
        cb()->doorbell.fetch_add(1);
    }
    void post_recv(WqView& wq, uint64_t wr_id, const std::vector<abi::Sge>& sges) {
        uint8_t* slot = wq.slot(*this, wq.prod);
        abi::RecvWqe h{wr_id, uint32_t(sges.size()), 0};
        std::memcpy(slot, &h, sizeof(h));
        if (!sges.empty()) std::memcpy(slot + sizeof(h), sges.data(), sges.size() * sizeof(abi::Sge));
        advance(wq);
    }

    static Result must(Result r) {
        if (r.status != 0) {
            std::fprintf(stderr, "fuzz setup: command failed with %d\n", r.status);
            std::abort();
        }
        return r;
    }

private:
    Engine& eng_;
    int fd_ = -1;
    uint8_t* base_ = nullptr;
    uint64_t ctx_id_ = 0;
    uint64_t next_ = 0;
    uint32_t prod_ = 0;
    uint32_t seq_ = 0;
};

// Three guests with connected QPs and registered memory (see the top).
struct World {
    Engine eng;
    const GuestIdentity& ga;
    const GuestIdentity& gb;
    const GuestIdentity& gc;
    Guest a, b, c;

    uint32_t a_pd = 0, b_pd = 0, c_pd = 0;
    Guest::MrInfo a_local, a_remote, b_granted, b_private, c_mr;
    Guest::CqView a_cq, a_cq2, b_cq, c_cq;
    Guest::QpView a_rc, a_loop, a_ud, a_srq_qp, b_rc, b_rc2, b_ud, c_rc;
    uint32_t a_srq = 0, a_ah_b = 0, a_ah_c = 0;
    uint64_t c_hash = 0, b_private_hash = 0;
    bool b_gone = false;

    World()
        : ga(eng.add_guest("a", 1, 0x1111)),
          gb(eng.add_guest("b", 2, 0x2222)),
          gc(eng.add_guest("c", 3, 0x3333)),
          a(eng, ga),
          b(eng, gb),
          c(eng, gc) {
        eng.set_clock(fake_clock);
        constexpr uint32_t kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC;
        a_pd = a.pd();
        b_pd = b.pd();
        c_pd = c.pd();
        a_local = a.mr(a_pd, 3 * 4096, IBV_ACCESS_LOCAL_WRITE, 0xa1);
        a_remote = a.mr(a_pd, 2 * 4096, kAll, 0xa2);
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
        // b posts receives into the MR it granted (its private one stays
        // untouched by anyone but b).
        for (int i = 0; i < 4; ++i) {
            b.post_recv(b_rc.rq, 100 + i, {abi::Sge{b_granted.addr, 4096, b_granted.key}});
            b.post_recv(b_ud.rq, 200 + i, {abi::Sge{b_granted.addr + 4096, 4096, b_granted.key}});
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
        switch (in.pick(9)) {
        case 0: return a_local.key;
        case 1: return a_remote.key;
        case 2: return b_granted.key;
        case 3: return b_private.key;
        case 4: return c_mr.key;
        case 5: return a_local.key + in.u8();
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
    Guest::QpView* a_qp(Input& in) {
        switch (in.pick(4)) {
        case 0: return &a_rc;
        case 1: return &a_loop;
        case 2: return &a_ud;
        default: return &a_srq_qp;
        }
    }
    uint32_t opcode(Input& in) {
        static constexpr uint32_t kOps[] = {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
                                            IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ,
                                            IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD};
        uint8_t v = in.u8();
        return v < 224 ? kOps[v % 7] : (v & 1 ? in.u32() : uint32_t(v - 224));
    }

    // Writes a send WQE built from the input at the producer slot of q and
    // publishes it.
    void post_send(Input& in, Guest::QpView& q) {
        uint8_t* slot = q.sq.slot(a, q.sq.prod);
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
        std::memcpy(slot, &w, sizeof(w));
        uint8_t* after = slot + sizeof(w);
        const uint32_t room = q.sq.stride - uint32_t(sizeof(w));
        if (w.send_flags & IBV_SEND_INLINE) {
            uint32_t n = std::min<uint32_t>(in.u8(), room);
            in.bytes(after, n);
        } else {
            uint32_t n = std::min<uint32_t>(w.num_sge, room / sizeof(abi::Sge));
            for (uint32_t i = 0; i < n; ++i) {
                abi::Sge s{addr(in), length(in), key(in)};
                std::memcpy(after + i * sizeof(s), &s, sizeof(s));
            }
        }
        a.advance(q.sq);
    }
    // A receive WQE into a's own receive queues (its RC loopback QP, its
    // UD QP, its SRQ) or b's (b is allowed to hurt itself only).
    void post_recv(Input& in) {
        Guest* g = &a;
        Guest::WqView* wq;
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
        uint8_t* slot = wq->slot(*g, wq->prod);
        abi::RecvWqe h{in.u32(), 0, 0};
        uint8_t ns = in.u8();
        h.num_sge = ns < 240 ? ns % 5 : in.u32();
        std::memcpy(slot, &h, sizeof(h));
        uint32_t n = std::min<uint32_t>(h.num_sge, (wq->stride - sizeof(h)) / sizeof(abi::Sge));
        for (uint32_t i = 0; i < n; ++i) {
            abi::Sge s;
            if (g == &b) {
                s = abi::Sge{b_granted.addr + in.u8(), uint32_t(in.u8()) * 16, b_granted.key};
            } else {
                s = abi::Sge{addr(in), length(in), key(in)};
            }
            std::memcpy(slot + sizeof(h) + i * sizeof(s), &s, sizeof(s));
        }
        g->advance(*wq);
    }
    void poll_all(Input& in) {
        uint32_t m = in.u8();
        a.poll(a_cq, m);
        a.poll(a_cq2, m);
        if (!b_gone) b.poll(b_cq, 64);
    }
};

}  // namespace vrdma::fuzz
