// In-process harness for the shim's unit tests: a "provider" that maps the
// same memfd arena as the shim's context, writes commands and WQEs into it
// exactly as the real provider does, and runs the engine one pass at a time.
#pragma once

#include <infiniband/verbs.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "engine.h"
#include "vrdma/abi.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::shim::test {

// Engine logs below warnings would drown the test output.
inline const bool g_quiet_logs = (set_log_level(LogLevel::Warn), true);

inline uint64_t g_fake_now = 1'000'000'000;
inline uint64_t fake_clock() { return g_fake_now; }

struct CmdResult {
    int status;
    alignas(8) uint8_t resp[abi::kCmdRespBytes];
    template <typename T>
    T as() const {
        T t;
        std::memcpy(&t, resp, sizeof(T));
        return t;
    }
};

struct QpSpec {
    uint32_t type = IBV_QPT_RC;
    uint32_t entries = 16;
    uint32_t stride = 1024;
    uint32_t max_sge = 4;
    uint32_t max_inline = 256;
    uint32_t srq = 0;
    uint32_t sig_all = 0;
};

// Memory of one attached process as the provider sees it.
class FakeProvider {
public:
    static constexpr uint64_t kArenaLen = 8 << 20;

    FakeProvider(Engine& eng, const GuestIdentity& guest) : eng_(eng) {
        fd_ = memfd_create("vrdma-test-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd_ >= 0) fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK);
        if (fd_ < 0 || ftruncate(fd_, kArenaLen) != 0) throw std::runtime_error("memfd");
        void* p = mmap(nullptr, kArenaLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
        if (p == MAP_FAILED) throw std::runtime_error("mmap");
        base_ = static_cast<uint8_t*>(p);
        int err = 0;
        ctx_ = eng.attach(guest, UniqueFd(dup(fd_)), gva(), kArenaLen, UniqueFd(), UniqueFd(), UniqueFd(), err);
        if (!ctx_) throw std::runtime_error("attach");
        ctx_id_ = ctx_->id();
        next_ = abi::kControlBlockBytes;
    }
    ~FakeProvider() {
        munmap(base_, kArenaLen);
        close(fd_);
    }

    Context& ctx() { return *ctx_; }
    uint64_t ctx_id() const { return ctx_id_; }
    abi::ControlBlock* cb() { return reinterpret_cast<abi::ControlBlock*>(base_); }
    uint64_t gva() const { return reinterpret_cast<uint64_t>(base_); }
    uint8_t* at(uint64_t gva) { return reinterpret_cast<uint8_t*>(gva); }
    int fd() const { return fd_; }

    // Bump allocation in the arena (the provider owns the memory layout).
    uint64_t alloc(uint64_t bytes, uint64_t align = 64) {
        next_ = (next_ + align - 1) & ~(align - 1);
        uint64_t g = gva() + next_;
        next_ += bytes;
        if (next_ > kArenaLen) throw std::runtime_error("arena full");
        std::memset(at(g), 0, bytes);
        return g;
    }

    void doorbell() { cb()->doorbell.fetch_add(1); }

    // Issues one command and runs the engine until it is done.
    template <typename Req>
    CmdResult cmd(abi::CmdOp op, const Req& req) {
        static_assert(sizeof(Req) <= abi::kCmdReqBytes);
        uint8_t raw[abi::kCmdReqBytes] = {};
        std::memcpy(raw, &req, sizeof(req));
        return cmd_raw(op, raw);
    }
    CmdResult cmd(abi::CmdOp op) {
        uint8_t raw[abi::kCmdReqBytes] = {};
        return cmd_raw(op, raw);
    }
    CmdResult cmd_raw(abi::CmdOp op, const uint8_t* raw) {
        abi::CmdSlot& s = cb()->cmd[ring_slot(prod_, abi::kCmdSlots)];
        s.op = op;
        std::memcpy(s.req, raw, abi::kCmdReqBytes);
        s.seq.store(++seq_);
        prod_ = ring_next(prod_, abi::kCmdSlots);
        cb()->cmd_producer.store(prod_);
        doorbell();
        eng_.poll_once();
        CmdResult r{};
        if (s.done_seq.load() != seq_) throw std::runtime_error("command not done");
        r.status = s.status;
        std::memcpy(r.resp, s.resp, sizeof(r.resp));
        return r;
    }

    // --- resources -------------------------------------------------------
    uint32_t pd() {
        auto r = cmd(abi::CmdOp::AllocPd);
        if (r.status) throw std::runtime_error("alloc_pd");
        return r.as<abi::CmdAllocPdResp>().pd_handle;
    }
    struct MrInfo {
        uint32_t handle, lkey, rkey;
        uint64_t addr;
    };
    MrInfo mr(uint32_t pd, uint64_t len, uint32_t access) {
        uint64_t addr = alloc(len, 4096);
        auto r = cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd, access, addr, len});
        if (r.status) throw std::runtime_error("reg_mr");
        auto m = r.as<abi::CmdRegMrResp>();
        return MrInfo{m.mr_handle, m.lkey, m.rkey, addr};
    }

    struct CqView {
        uint32_t handle = 0;
        uint64_t ring = 0;
        uint32_t entries = 0;
        uint32_t cons = 0;
    };
    CqView cq(uint32_t entries) {
        CqView v;
        v.entries = entries;
        v.ring = alloc(abi::cq_ring_bytes(entries));
        abi::CmdCreateCqReq req{};
        req.ring_gva = v.ring;
        req.entries = entries;
        req.user_handle = 0xc0ffee;
        auto r = cmd(abi::CmdOp::CreateCq, req);
        if (r.status) throw std::runtime_error("create_cq");
        v.handle = r.as<abi::CmdCreateCqResp>().cq_handle;
        return v;
    }
    // Polls up to max CQEs (the consumer side of the CQ ring).
    std::vector<abi::Cqe> poll(CqView& cq, uint32_t max = 1024) {
        std::vector<abi::Cqe> out;
        auto* hdr = reinterpret_cast<abi::RingHeader*>(at(cq.ring));
        auto* slots = reinterpret_cast<abi::Cqe*>(at(cq.ring + abi::cq_slots_offset()));
        while (out.size() < max && hdr->producer.load() != cq.cons) {
            out.push_back(slots[ring_slot(cq.cons, cq.entries)]);
            cq.cons = ring_next(cq.cons, cq.entries);
            hdr->consumer.store(cq.cons);
        }
        return out;
    }

    struct WqView {
        uint64_t ring = 0;
        uint32_t entries = 0, stride = 0, prod = 0;
    };
    struct QpView {
        uint32_t handle = 0, qpn = 0;
        WqView sq, rq;
    };
    using QpSpec = test::QpSpec;
    abi::CmdCreateQpReq qp_req(uint32_t pd, const CqView& scq, const CqView& rcq, const QpSpec& s, QpView& v) {
        abi::CmdCreateQpReq req{};
        v.sq = WqView{alloc(abi::wq_ring_bytes(s.entries, s.stride)), s.entries, s.stride, 0};
        if (!s.srq) v.rq = WqView{alloc(abi::wq_ring_bytes(s.entries, 256)), s.entries, 256, 0};
        req.sq_gva = v.sq.ring;
        req.rq_gva = s.srq ? 0 : v.rq.ring;
        req.user_handle = 0x9999;
        req.pd_handle = pd;
        req.qp_type = s.type;
        req.send_cq_handle = scq.handle;
        req.recv_cq_handle = rcq.handle;
        req.srq_handle = s.srq;
        req.sq_entries = s.entries;
        req.sq_stride = s.stride;
        req.rq_entries = s.srq ? 0 : s.entries;
        req.rq_stride = s.srq ? 0 : 256;
        req.max_send_sge = s.max_sge;
        req.max_recv_sge = s.srq ? 0 : s.max_sge;
        req.max_inline_data = s.max_inline;
        req.sq_sig_all = s.sig_all;
        return req;
    }
    QpView qp(uint32_t pd, const CqView& scq, const CqView& rcq, QpSpec s = {}) {
        QpView v;
        auto req = qp_req(pd, scq, rcq, s, v);
        auto r = cmd(abi::CmdOp::CreateQp, req);
        if (r.status) throw std::runtime_error("create_qp " + std::to_string(r.status));
        auto resp = r.as<abi::CmdCreateQpResp>();
        v.handle = resp.qp_handle;
        v.qpn = resp.qpn;
        return v;
    }

    int modify(uint32_t qp, uint32_t mask, const abi::QpAttr& a) {
        abi::CmdModifyQpReq req{};
        req.qp_handle = qp;
        req.attr_mask = mask;
        req.attr = a;
        return cmd(abi::CmdOp::ModifyQp, req).status;
    }
    // RESET -> INIT -> RTR -> RTS for an RC QP connected to (dlid, dqpn).
    void connect_rc(const QpView& q, uint16_t dlid, uint32_t dqpn, uint32_t access, uint8_t rnr_retry = 7,
                    uint8_t retry_cnt = 7, uint8_t min_rnr = 12) {
        abi::QpAttr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qp_access_flags = access;
        if (modify(q.handle, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, a))
            throw std::runtime_error("to INIT");
        a = {};
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_4096;
        a.dest_qp_num = dqpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = min_rnr;
        a.ah.dlid = dlid;
        a.ah.port_num = 1;
        a.ah.sl = 3;
        if (modify(q.handle, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                   a))
            throw std::runtime_error("to RTR");
        a = {};
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = retry_cnt;
        a.rnr_retry = rnr_retry;
        a.sq_psn = 0;
        a.max_rd_atomic = 1;
        if (modify(q.handle, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                 IBV_QP_MAX_QP_RD_ATOMIC,
                   a))
            throw std::runtime_error("to RTS");
    }
    void ud_ready(const QpView& q, uint32_t qkey) {
        abi::QpAttr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qkey = qkey;
        if (modify(q.handle, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, a))
            throw std::runtime_error("UD to INIT");
        a = {};
        a.qp_state = IBV_QPS_RTR;
        if (modify(q.handle, IBV_QP_STATE, a)) throw std::runtime_error("UD to RTR");
        a.qp_state = IBV_QPS_RTS;
        if (modify(q.handle, IBV_QP_STATE | IBV_QP_SQ_PSN, a)) throw std::runtime_error("UD to RTS");
    }
    uint32_t qp_state(uint32_t qp) {
        auto r = cmd(abi::CmdOp::QueryQp, abi::CmdHandleReq{qp});
        return r.as<abi::CmdQueryQpResp>().attr.qp_state;
    }

    // --- posting ---------------------------------------------------------
    void post_send(WqView& wq, const abi::SendWqe& hdr, std::vector<abi::Sge> sges = {}, const void* inline_data = nullptr) {
        uint8_t* slot = at(wq.ring + abi::wq_slots_offset() + uint64_t(ring_slot(wq.prod, wq.entries)) * wq.stride);
        abi::SendWqe h = hdr;
        if (inline_data) {
            std::memcpy(slot + sizeof(h), inline_data, h.inline_len);
        } else {
            if (h.num_sge == 0) h.num_sge = uint32_t(sges.size());
            if (!sges.empty()) std::memcpy(slot + sizeof(h), sges.data(), sges.size() * sizeof(abi::Sge));
        }
        std::memcpy(slot, &h, sizeof(h));
        wq.prod = ring_next(wq.prod, wq.entries);
        reinterpret_cast<abi::RingHeader*>(at(wq.ring))->producer.store(wq.prod);
        doorbell();
    }
    void post_recv(WqView& wq, uint64_t wr_id, std::vector<abi::Sge> sges) {
        uint8_t* slot = at(wq.ring + abi::wq_slots_offset() + uint64_t(ring_slot(wq.prod, wq.entries)) * wq.stride);
        abi::RecvWqe h{wr_id, uint32_t(sges.size()), 0};
        std::memcpy(slot, &h, sizeof(h));
        if (!sges.empty()) std::memcpy(slot + sizeof(h), sges.data(), sges.size() * sizeof(abi::Sge));
        wq.prod = ring_next(wq.prod, wq.entries);
        reinterpret_cast<abi::RingHeader*>(at(wq.ring))->producer.store(wq.prod);
        doorbell();
    }
    uint32_t consumer_of(const WqView& wq) { return reinterpret_cast<abi::RingHeader*>(at(wq.ring))->consumer.load(); }

private:
    Engine& eng_;
    int fd_ = -1;
    uint8_t* base_ = nullptr;
    Context* ctx_ = nullptr;
    uint64_t ctx_id_ = 0;
    uint64_t next_ = 0;
    uint32_t prod_ = 0;
    uint32_t seq_ = 0;
};

inline abi::SendWqe send_wqe(uint64_t wr_id, uint32_t opcode, uint32_t flags = IBV_SEND_SIGNALED) {
    abi::SendWqe w{};
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.send_flags = flags;
    return w;
}

// Two guests (LIDs 1 and 2) of one engine with the fake clock.
struct TwoGuests {
    Engine eng;
    const GuestIdentity& ga;
    const GuestIdentity& gb;
    FakeProvider a, b;
    TwoGuests()
        : ga(eng.add_guest("a", 1, 0x1111)), gb(eng.add_guest("b", 2, 0x2222)), a(eng, ga), b(eng, gb) {
        eng.set_clock(fake_clock);
    }
    void run(int passes = 4) {
        for (int i = 0; i < passes; ++i) eng.poll_once();
    }
};

}  // namespace vrdma::shim::test
