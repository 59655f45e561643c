// The one test client of the device ABI (include/vrdma/abi.h), shared by
// the unit-test harness (test/unit/shim_harness.h), the fuzz harnesses
// (test/fuzz/fuzz_common.h) and the adversarial guest
// (test/integration/adversarial_guest.cpp). It does what the provider does,
// with none of its policy, so that a test can also do it wrong:
//
//   - memfd arenas with the seals the shim asks for, and a bump allocator in
//     them (the ControlBlock at offset 0);
//   - the command ring: slots, seq, the producer index, the doorbell (and the
//     kick eventfd when the shim sleeps), waiting for done_seq;
//   - resources (PD, MR, CQ, QP, SRQ, AH, QP state changes) as commands;
//   - send and receive WQEs with their SGEs or inline data, producer index
//     updates, CQE polling;
//   - the socket protocol: Attach (arena memfd, kick and cmd-done eventfds,
//     async pipe) and the other messages, with fd passing.
//
// How a command is waited for is the caller's: in-process the engine runs
// one pass (in_process()), out of process the client polls done_seq and the
// cmd-done eventfd until a deadline (ShimConnection). Nothing here throws or
// aborts: calls return 0, a positive errno from the shim, or kHungUp /
// kNoAnswer, and each harness decides what a failure means to it.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "vrdma/abi.h"
#include "vrdma/ring.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::abi_client {

namespace abi = vrdma::abi;

// Outcomes that are not the shim's status (which is 0 or a positive errno).
constexpr int kHungUp = -1;    // the shim closed the connection
constexpr int kNoAnswer = -2;  // not done: no answer in time, or not in this engine pass

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

// A memfd of `size` bytes with `seals` (F_SEAL_*, 0: none) added; sealable
// false creates it without MFD_ALLOW_SEALING. -1 on failure.
inline int make_memfd(uint64_t size, unsigned seals = F_SEAL_SHRINK, bool sealable = true,
                      const char* name = "vrdma-test") {
    int fd = memfd_create(name, MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
    if (fd < 0) return -1;
    if (ftruncate(fd, off_t(size)) != 0 || (seals && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// Guest memory shared with the shim: a memfd mapped at some address, which
// is also its guest virtual address. The ControlBlock is at offset 0; alloc()
// hands out the rest front to back (the provider owns the layout).
class Arena {
public:
    Arena() = default;
    ~Arena() { close(); }
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;

    // false when the memfd or the mapping cannot be made. `fixed_gva`
    // (nonzero): map it exactly there (MAP_FIXED_NOREPLACE), so that guest
    // addresses are the same in every run (fuzz seeds name them).
    bool open(uint64_t len, unsigned seals = F_SEAL_SHRINK, const char* name = "vrdma-test-arena",
              uint64_t fixed_gva = 0) {
        close();
        fd_.reset(make_memfd(len, seals, true, name));
        if (!fd_) return false;
        void* p = mmap(reinterpret_cast<void*>(fixed_gva), len, PROT_READ | PROT_WRITE,
                       MAP_SHARED | (fixed_gva ? MAP_FIXED_NOREPLACE : 0), fd_.get(), 0);
        if (fixed_gva && p != MAP_FAILED && p != reinterpret_cast<void*>(fixed_gva)) {
            munmap(p, len);  // a kernel without MAP_FIXED_NOREPLACE took it as a hint
            p = MAP_FAILED;
        }
        if (p == MAP_FAILED) {
            fd_.reset();
            return false;
        }
        base_ = static_cast<uint8_t*>(p);
        len_ = len;
        next_ = abi::kControlBlockBytes;
        return true;
    }
    void close() {
        if (base_) munmap(base_, len_);
        base_ = nullptr;
        len_ = 0;
        fd_.reset();
    }

    bool ok() const { return base_ != nullptr; }
    int fd() const { return fd_.get(); }
    uint64_t len() const { return len_; }
    uint8_t* base() const { return base_; }
    uint64_t gva() const { return reinterpret_cast<uint64_t>(base_); }
    abi::ControlBlock* cb() const { return reinterpret_cast<abi::ControlBlock*>(base_); }

    // `bytes` at an `align`-aligned gva past the control block; 0 when they
    // do not fit, or, with wrap_when_full, from the first free byte again
    // (memory still in use is handed out twice: for tests that do not care).
    uint64_t alloc(uint64_t bytes, uint64_t align = 64) {
        uint64_t at = (next_ + align - 1) & ~(align - 1);
        if (at + bytes > len_) {
            if (!wrap_when_full) return 0;
            at = (abi::kControlBlockBytes + align - 1) & ~(align - 1);
            if (at + bytes > len_) return 0;
        }
        next_ = at + bytes;
        return gva() + at;
    }
    bool wrap_when_full = false;

private:
    UniqueFd fd_;
    uint8_t* base_ = nullptr;
    uint64_t len_ = 0;
    uint64_t next_ = 0;
};

// Any guest virtual address of this process's own memory.
inline uint8_t* at(uint64_t gva) { return reinterpret_cast<uint8_t*>(gva); }

// ---------------------------------------------------------------------------
// Views of the queues the client created
// ---------------------------------------------------------------------------
struct CmdResult {
    int status = kNoAnswer;  // the slot's status once done, else kHungUp / kNoAnswer
    alignas(8) uint8_t resp[abi::kCmdRespBytes] = {};
    bool done() const { return status >= 0; }
    template <typename T>
    T as() const {
        static_assert(sizeof(T) <= abi::kCmdRespBytes);
        T t;
        std::memcpy(&t, resp, sizeof(T));
        return t;
    }
};
// One command record: the op (any value) and its request bytes (at most
// kCmdReqBytes are used, the rest of the slot's request is zeroed).
using CmdRecord = std::pair<uint32_t, std::vector<uint8_t>>;

struct MrInfo {
    uint32_t handle = 0, lkey = 0, rkey = 0;
    uint64_t addr = 0, len = 0;
};
struct CqView {
    uint32_t handle = 0;
    uint64_t ring = 0;
    uint32_t entries = 0;
    uint32_t cons = 0;  // the client's consumer index
};
struct WqView {
    uint64_t ring = 0;
    uint32_t entries = 0, stride = 0;
    uint32_t prod = 0;  // the client's producer index
    uint32_t work_slot = abi::kNoWorkSlot;  // a QP's bit in ControlBlock::work_bits (else the doorbell)
};
struct QpView {
    uint32_t handle = 0, qpn = 0, type = IBV_QPT_RC;
    WqView sq, rq;  // rq unused with an SRQ
    bool srq = false;
};
// The geometry of a new QP; the send and receive queues have `entries` each.
struct QpSpec {
    uint32_t type = IBV_QPT_RC;
    uint32_t entries = 16;
    uint32_t stride = 1024;     // send queue
    uint32_t rq_stride = 256;
    uint32_t max_sge = 4;       // send and receive
    uint32_t max_inline = 256;
    uint32_t srq = 0;           // SRQ handle, 0: own receive queue
    uint32_t sig_all = 0;
    uint64_t user_handle = 0x9999;
};
// RESET -> INIT -> RTR -> RTS of an RC QP connected to (dlid, dqpn).
struct RcPath {
    uint16_t dlid = 0;
    uint32_t dqpn = 0;
    uint32_t access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC;
    uint8_t sl = 0;
    uint8_t min_rnr_timer = 1;
    uint8_t timeout = 1;
    uint8_t retry_cnt = 1;
    uint8_t rnr_retry = 1;
    uint32_t rq_psn = 0;  // the first PSN the QP expects
    uint32_t sq_psn = 0;  // the first PSN it sends
};

// ---------------------------------------------------------------------------
// The client: one attached context's arena, command ring and queues
// ---------------------------------------------------------------------------
class Client {
public:
    // Runs the shim (or waits for it) until done() holds; returns 0, or
    // kHungUp / kNoAnswer when it gives up.
    using Wait = std::function<int(const std::function<bool()>& done)>;

    Client() = default;
    explicit Client(Wait wait) : wait_(std::move(wait)) {}
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    void set_wait(Wait w) { wait_ = std::move(w); }
    // The kick eventfd, written after the doorbell while the shim sleeps
    // (-1: none, the in-process engine never sleeps).
    void set_kick_fd(int fd) { kick_fd_ = fd; }

    Arena& arena() { return arena_; }
    uint64_t gva() const { return arena_.gva(); }
    uint8_t* base() const { return arena_.base(); }
    abi::ControlBlock* cb() const { return arena_.cb(); }
    uint8_t* at(uint64_t g) const { return abi_client::at(g); }
    uint64_t alloc(uint64_t bytes, uint64_t align = 64) { return arena_.alloc(bytes, align); }

    // The doorbell; the kick eventfd too when the shim says it sleeps.
    void ring() {
        cb()->doorbell.fetch_add(1);
        kick_if_sleeping();
    }
    void kick_if_sleeping() {
        if (kick_fd_ >= 0 && cb()->shim_sleeping.load()) {
            uint64_t one = 1;
            (void)!::write(kick_fd_, &one, sizeof(one));
        }
    }

    // --- command ring ----------------------------------------------------
    // Writes the records into the slots from the producer index on, then
    // advances the producer by `advance` (normally recs.size(); any value
    // for tests of bad indices), rings and waits. One result per record.
    std::vector<CmdResult> cmds(const std::vector<CmdRecord>& recs, uint32_t advance) {
        std::vector<std::pair<abi::CmdSlot*, uint32_t>> posted;
        for (size_t i = 0; i < recs.size(); ++i) {
            abi::CmdSlot& s = cb()->cmd[ring_slot(ring_advance(prod_, uint32_t(i), abi::kCmdSlots), abi::kCmdSlots)];
            const std::vector<uint8_t>& req = recs[i].second;
            write_slot(s, recs[i].first, req.empty() ? nullptr : req.data(), req.size());
            posted.emplace_back(&s, seq_);
        }
        prod_ = ring_advance(prod_, advance, abi::kCmdSlots);
        cb()->cmd_producer.store(prod_);
        ring();
        int waited = wait_([&] {
            for (auto& [s, seq] : posted)
                if (s->done_seq.load() != seq) return false;
            return true;
        });
        std::vector<CmdResult> out(recs.size());
        for (size_t i = 0; i < posted.size(); ++i) collect(*posted[i].first, posted[i].second, waited, out[i]);
        return out;
    }
    // One command with `len` request bytes (the rest zero).
    CmdResult cmd_raw(uint32_t op, const void* req, size_t len) {
        abi::CmdSlot& s = cb()->cmd[ring_slot(prod_, abi::kCmdSlots)];
        write_slot(s, op, req, len);
        const uint32_t seq = seq_;
        prod_ = ring_next(prod_, abi::kCmdSlots);
        cb()->cmd_producer.store(prod_);
        ring();
        int waited = wait_([&] { return s.done_seq.load() == seq; });
        CmdResult r;
        collect(s, seq, waited, r);
        return r;
    }
    template <typename Req>
    CmdResult cmd(abi::CmdOp op, const Req& req) {
        static_assert(sizeof(Req) <= abi::kCmdReqBytes);
        return cmd_raw(uint32_t(op), &req, sizeof(req));
    }
    CmdResult cmd(abi::CmdOp op) { return cmd_raw(uint32_t(op), nullptr, 0); }
    // The command producer index as the client last published it.
    uint32_t& cmd_producer() { return prod_; }

    // --- resources: 0 or the command's status ---------------------------
    int alloc_pd(uint32_t& pd) {
        auto r = cmd(abi::CmdOp::AllocPd);
        if (r.status == 0) pd = r.as<abi::CmdAllocPdResp>().pd_handle;
        return r.status;
    }
    int reg_mr(uint32_t pd, uint64_t addr, uint64_t len, uint32_t access, MrInfo& out) {
        auto r = cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd, access, addr, len, addr});
        if (r.status) return r.status;
        auto m = r.as<abi::CmdRegMrResp>();
        out = MrInfo{m.mr_handle, m.lkey, m.rkey, addr, len};
        return 0;
    }
    // Allocates the ring in the arena (kNoAnswer when it does not fit).
    int create_cq(uint32_t entries, CqView& v, uint64_t user_handle = 0) {
        v = CqView{0, alloc(abi::cq_ring_bytes(entries)), entries, 0};
        if (!v.ring) return kNoAnswer;
        abi::CmdCreateCqReq req{};
        req.ring_gva = v.ring;
        req.user_handle = user_handle;
        req.entries = entries;
        auto r = cmd(abi::CmdOp::CreateCq, req);
        if (r.status == 0) v.handle = r.as<abi::CmdCreateCqResp>().cq_handle;
        return r.status;
    }
    // The CreateQp request for `s`, with its rings allocated in the arena and
    // described in v (for tests that change the request before sending it).
    abi::CmdCreateQpReq qp_request(uint32_t pd, uint32_t send_cq, uint32_t recv_cq, const QpSpec& s, QpView& v) {
        v = QpView{};
        v.type = s.type;
        v.srq = s.srq != 0;
        v.sq = WqView{alloc(abi::wq_ring_bytes(s.entries, s.stride)), s.entries, s.stride, 0};
        if (!s.srq) v.rq = WqView{alloc(abi::wq_ring_bytes(s.entries, s.rq_stride)), s.entries, s.rq_stride, 0};
        abi::CmdCreateQpReq req{};
        req.sq_gva = v.sq.ring;
        req.rq_gva = s.srq ? 0 : v.rq.ring;
        req.user_handle = s.user_handle;
        req.pd_handle = pd;
        req.qp_type = s.type;
        req.send_cq_handle = send_cq;
        req.recv_cq_handle = recv_cq;
        req.srq_handle = s.srq;
        req.sq_entries = s.entries;
        req.sq_stride = s.stride;
        req.rq_entries = s.srq ? 0 : s.entries;
        req.rq_stride = s.srq ? 0 : s.rq_stride;
        req.max_send_sge = s.max_sge;
        req.max_recv_sge = s.srq ? 0 : s.max_sge;
        req.max_inline_data = s.max_inline;
        req.sq_sig_all = s.sig_all;
        return req;
    }
    int create_qp(uint32_t pd, uint32_t send_cq, uint32_t recv_cq, const QpSpec& s, QpView& v) {
        auto req = qp_request(pd, send_cq, recv_cq, s, v);
        auto r = cmd(abi::CmdOp::CreateQp, req);
        if (r.status) return r.status;
        auto resp = r.as<abi::CmdCreateQpResp>();
        v.handle = resp.qp_handle;
        v.qpn = resp.qpn;
        if (resp.work_slot < abi::kWorkSlots) v.sq.work_slot = v.rq.work_slot = resp.work_slot;
        return 0;
    }
    int create_srq(uint32_t pd, uint32_t entries, uint32_t stride, uint32_t max_sge, WqView& ring, uint32_t& srq) {
        ring = WqView{alloc(abi::wq_ring_bytes(entries, stride)), entries, stride, 0};
        abi::CmdCreateSrqReq req{};
        req.ring_gva = ring.ring;
        req.pd_handle = pd;
        req.entries = entries;
        req.stride = stride;
        req.max_sge = max_sge;
        auto r = cmd(abi::CmdOp::CreateSrq, req);
        if (r.status == 0) srq = r.as<abi::CmdCreateSrqResp>().srq_handle;
        return r.status;
    }
    int create_ah(uint32_t pd, uint16_t dlid, uint32_t& ah) {
        abi::CmdCreateAhReq req{};
        req.pd_handle = pd;
        req.attr.dlid = dlid;
        req.attr.port_num = 1;
        auto r = cmd(abi::CmdOp::CreateAh, req);
        if (r.status == 0) ah = r.as<abi::CmdCreateAhResp>().ah_handle;
        return r.status;
    }
    int modify_qp(uint32_t qp, uint32_t mask, const abi::QpAttr& a) {
        abi::CmdModifyQpReq req{};
        req.qp_handle = qp;
        req.attr_mask = mask;
        req.attr = a;
        return cmd(abi::CmdOp::ModifyQp, req).status;
    }
    int connect_rc(uint32_t qp, const RcPath& p) {
        abi::QpAttr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qp_access_flags = p.access;
        if (int rc = modify_qp(qp, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, a)) return rc;
        a = {};
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_4096;
        a.dest_qp_num = p.dqpn;
        a.rq_psn = p.rq_psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = p.min_rnr_timer;
        a.ah.dlid = p.dlid;
        a.ah.port_num = 1;
        a.ah.sl = p.sl;
        if (int rc = modify_qp(qp,
                               IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                               a))
            return rc;
        a = {};
        a.qp_state = IBV_QPS_RTS;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        a.sq_psn = p.sq_psn;
        a.max_rd_atomic = 1;
        return modify_qp(qp,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                             IBV_QP_MAX_QP_RD_ATOMIC,
                         a);
    }
    // RESET -> INIT -> RTR -> RTS of a UD QP.
    int connect_ud(uint32_t qp, uint32_t qkey) {
        abi::QpAttr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qkey = qkey;
        if (int rc = modify_qp(qp, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, a)) return rc;
        a = {};
        a.qp_state = IBV_QPS_RTR;
        if (int rc = modify_qp(qp, IBV_QP_STATE, a)) return rc;
        a.qp_state = IBV_QPS_RTS;
        return modify_qp(qp, IBV_QP_STATE | IBV_QP_SQ_PSN, a);
    }

    // --- work queues and completions -------------------------------------
    abi::RingHeader* ring_header(uint64_t ring) const { return reinterpret_cast<abi::RingHeader*>(at(ring)); }
    // The slot of ring index idx.
    uint8_t* wqe_slot(const WqView& wq, uint32_t idx) const {
        return at(wq.ring + abi::wq_slots_offset() + uint64_t(ring_slot(idx, wq.entries)) * wq.stride);
    }
    uint32_t consumer_of(const WqView& wq) const { return ring_header(wq.ring)->consumer.load(); }
    // Publishes the n WQEs written from the producer slot on: the producer
    // index, then the QP's work bit (the doorbell for a queue without one).
    void publish(WqView& wq, uint32_t n = 1) {
        wq.prod = ring_advance(wq.prod, n, wq.entries);
        ring_header(wq.ring)->producer.store(wq.prod);
        announce(wq);
    }
    // Tells the shim that `wq` has news: its work bit, or the doorbell.
    void announce(const WqView& wq) {
        if (wq.work_slot >= abi::kWorkSlots) return ring();
        cb()->work_bits[wq.work_slot / 64].fetch_or(uint64_t(1) << (wq.work_slot % 64));
        cb()->work_summary.fetch_or(uint64_t(1) << (wq.work_slot / 64));
        kick_if_sleeping();
    }
    // Writes a send WQE at the producer slot, exactly as given (num_sge and
    // inline_len are not touched), followed by the SGEs or the inline bytes,
    // each cut to what the slot holds; then publishes it.
    void post_send(WqView& wq, const abi::SendWqe& hdr, std::span<const abi::Sge> sges = {},
                   std::span<const uint8_t> inline_data = {}) {
        uint8_t* slot = wqe_slot(wq, wq.prod);
        const size_t room = wq.stride - sizeof(hdr);
        if (!inline_data.empty()) {
            std::memcpy(slot + sizeof(hdr), inline_data.data(), std::min(inline_data.size(), room));
        } else if (!sges.empty()) {
            std::memcpy(slot + sizeof(hdr), sges.data(), std::min(sges.size(), room / sizeof(abi::Sge)) * sizeof(abi::Sge));
        }
        std::memcpy(slot, &hdr, sizeof(hdr));
        publish(wq);
    }
    // A receive WQE, exactly as given, with its SGEs (cut to the slot).
    void post_recv(WqView& wq, const abi::RecvWqe& hdr, std::span<const abi::Sge> sges) {
        uint8_t* slot = wqe_slot(wq, wq.prod);
        std::memcpy(slot, &hdr, sizeof(hdr));
        const size_t room = (wq.stride - sizeof(hdr)) / sizeof(abi::Sge);
        if (!sges.empty()) std::memcpy(slot + sizeof(hdr), sges.data(), std::min(sges.size(), room) * sizeof(abi::Sge));
        publish(wq);
    }
    void post_recv(WqView& wq, uint64_t wr_id, std::span<const abi::Sge> sges) {
        post_recv(wq, abi::RecvWqe{wr_id, uint32_t(sges.size()), 0}, sges);
    }
    void post_recv(WqView& wq, uint64_t wr_id, std::initializer_list<abi::Sge> sges) {
        post_recv(wq, wr_id, std::span<const abi::Sge>(sges.begin(), sges.size()));
    }
    // Consumes up to max CQEs, as the provider does; appends them to *out
    // when given. Returns how many.
    uint32_t poll_cq(CqView& cq, uint32_t max, std::vector<abi::Cqe>* out = nullptr) {
        abi::RingHeader* hdr = ring_header(cq.ring);
        const auto* slots = reinterpret_cast<const abi::Cqe*>(at(cq.ring + abi::cq_slots_offset()));
        uint32_t n = 0;
        while (n < max && hdr->producer.load() != cq.cons) {
            if (out) out->push_back(slots[ring_slot(cq.cons, cq.entries)]);
            cq.cons = ring_next(cq.cons, cq.entries);
            hdr->consumer.store(cq.cons);
            ++n;
        }
        return n;
    }

private:
    void write_slot(abi::CmdSlot& s, uint32_t op, const void* req, size_t len) {
        std::memcpy(&s.op, &op, sizeof(op));  // any value, not only a CmdOp
        std::memset(s.req, 0, sizeof(s.req));
        if (len) std::memcpy(s.req, req, std::min(len, sizeof(s.req)));
        s.seq.store(++seq_);
    }
    static void collect(const abi::CmdSlot& s, uint32_t seq, int waited, CmdResult& r) {
        if (s.done_seq.load() == seq) {
            r.status = s.status;
            std::memcpy(r.resp, s.resp, sizeof(r.resp));
        } else {
            r.status = waited < 0 ? waited : kNoAnswer;
        }
    }

    Arena arena_;
    Wait wait_;
    int kick_fd_ = -1;
    uint32_t prod_ = 0;
    uint32_t seq_ = 0;
};

// ---------------------------------------------------------------------------
// In process: the shim's Engine (src/shim/engine/engine.h) in this process
// ---------------------------------------------------------------------------

// Waiting is one engine pass, whether or not it completed the command.
template <typename EngineT>
Client::Wait in_process(EngineT& eng) {
    return [&eng](const std::function<bool()>& done) {
        eng.poll_once();
        return done() ? 0 : kNoAnswer;
    };
}

// Attaches the client's arena to the engine as the daemon does after an
// Attach message, without eventfds or async pipe. The context, or null.
template <typename EngineT, typename GuestT>
auto attach_in_process(EngineT& eng, const GuestT& guest, Client& c) {
    int err = 0;
    return eng.attach(guest, UniqueFd(dup(c.arena().fd())), c.gva(), c.arena().len(), UniqueFd(), UniqueFd(),
                      UniqueFd(), err);
}

// ---------------------------------------------------------------------------
// Out of process: the socket protocol to a running shim
// ---------------------------------------------------------------------------
inline abi::SockHeader sock_header(abi::SockOp op) { return abi::SockHeader{abi::kMagic, abi::kVersion, op, 0}; }

// A SOCK_SEQPACKET connection to the shim's socket, -1 on failure.
inline int connect_socket(const std::string& path) {
    int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(s);
        return -1;
    }
    return s;
}

// Sends one message (any bytes, up to kMaxSentFds fds): 0 or an errno.
inline int send_msg(int sock, const void* msg, size_t len, std::span<const int> fds = {}, int flags = 0) {
    return send_with_fds(sock, msg, len, fds, flags);
}
inline int send_msg(int sock, const void* msg, size_t len, std::initializer_list<int> fds, int flags = 0) {
    return send_msg(sock, msg, len, std::span<const int>(fds.begin(), fds.size()), flags);
}

// Waits up to ms for one SockReply: its status, kHungUp (EOF), kNoAnswer
// (nothing in time), -3 (a reply of the wrong size).
inline int await_reply(int sock, int ms, abi::SockReply* out = nullptr) {
    pollfd p{sock, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return kNoAnswer;
    abi::SockReply r{};
    ssize_t n = ::recv(sock, &r, sizeof(r), MSG_DONTWAIT);
    if (n <= 0) return kHungUp;
    if (out) *out = r;
    return n == ssize_t(sizeof(r)) ? r.status : -3;
}

inline abi::SockAttach attach_msg(uint64_t arena_gva, uint64_t arena_len) {
    abi::SockAttach a{};
    a.hdr = sock_header(abi::SockOp::Attach);
    a.arena_gva = arena_gva;
    a.arena_len = arena_len;
    return a;
}
inline abi::SockAddSegment add_segment_msg(uint64_t gva, uint64_t len, uint64_t offset, uint32_t seg_id) {
    abi::SockAddSegment s{};
    s.hdr = sock_header(abi::SockOp::AddSegment);
    s.gva = gva;
    s.len = len;
    s.offset = offset;
    s.seg_id = seg_id;
    return s;
}
inline abi::SockRemoveSegment remove_segment_msg(uint32_t seg_id) {
    abi::SockRemoveSegment s{};
    s.hdr = sock_header(abi::SockOp::RemoveSegment);
    s.seg_id = seg_id;
    return s;
}
inline abi::SockChannel create_channel_msg(uint32_t channel_id) {
    abi::SockChannel m{};
    m.hdr = sock_header(abi::SockOp::CreateChannel);
    m.channel_id = channel_id;
    return m;
}

inline uint64_t now_ms() {
    return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

// One connection to a running shim, attached as the provider attaches:
// the arena memfd, the kick and cmd-done eventfds, the write end of the
// async pipe. Commands wait on done_seq and the cmd-done eventfd.
class ShimConnection : public Client {
public:
    ShimConnection() { set_wait([this](const std::function<bool()>& done) { return wait(done); }); }
    ~ShimConnection() { close_all(); }

    // 0 on success, else the shim's status, kHungUp / kNoAnswer, or -4 (no
    // connection), -5 (no arena), -6 (no pipe), -7 (send failed).
    int attach(const std::string& socket_path, uint64_t arena_len, bool seal = true, int ms = 5000) {
        sock_.reset(connect_socket(socket_path));
        if (!sock_) return -4;
        if (!arena().open(arena_len, seal ? F_SEAL_SHRINK : 0)) return -5;
        kick_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        done_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        set_kick_fd(kick_.get());
        int ap[2];
        if (pipe2(ap, O_CLOEXEC | O_NONBLOCK) != 0) return -6;
        async_r_.reset(ap[0]);
        async_w_.reset(ap[1]);
        auto a = attach_msg(gva(), arena_len);
        if (send_msg(sock_.get(), &a, sizeof(a), {arena().fd(), kick_.get(), done_.get(), async_w_.get()})) return -7;
        abi::SockReply r{};
        int st = await_reply(sock_.get(), ms, &r);
        if (st == 0) lid_ = r.guest_lid;
        return st;
    }
    void close_all() {
        for (UniqueFd* fd : {&sock_, &kick_, &done_, &async_r_, &async_w_}) fd->reset();
        set_kick_fd(-1);
        arena().close();
    }

    int sock() const { return sock_.get(); }
    int kick_fd() const { return kick_.get(); }
    int done_fd() const { return done_.get(); }
    int async_r() const { return async_r_.get(); }
    int async_w() const { return async_w_.get(); }
    uint32_t lid() const { return lid_; }

    // The shim hung up on us (or is gone).
    bool hung_up() const {
        pollfd p{sock_.get(), POLLIN | POLLRDHUP, 0};
        if (::poll(&p, 1, 0) <= 0) return false;
        return p.revents & (POLLHUP | POLLRDHUP | POLLERR);
    }

    // How long a command may take.
    int cmd_timeout_ms = 3000;
    // false: never read the cmd-done eventfd (a saturated counter stays so).
    bool drain_done = true;

private:
    int wait(const std::function<bool()>& done) {
        const uint64_t deadline = now_ms() + uint64_t(cmd_timeout_ms);
        for (;;) {
            if (done()) return 0;
            if (hung_up()) return kHungUp;
            if (now_ms() > deadline) return kNoAnswer;
            pollfd p[2] = {{done_.get(), POLLIN, 0}, {sock_.get(), POLLIN | POLLRDHUP, 0}};
            ::poll(p, 2, drain_done ? 1 : 0);
            uint64_t v;
            if (drain_done) (void)!::read(done_.get(), &v, sizeof(v));
            else usleep(50);
        }
    }

    UniqueFd sock_, kick_, done_, async_r_, async_w_;
    uint32_t lid_ = 0;
};

}  // namespace vrdma::abi_client
