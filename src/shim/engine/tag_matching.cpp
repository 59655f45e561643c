#include "tag_matching.h"

#include <endian.h>
#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "async_events.h"
#include "cq_writer.h"
#include "engine.h"
#include "psn.h"
#include "qp_state.h"
#include "requester.h"
#include "transport.h"
#include "work_queue.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

// The tag-matching header (struct ibv_tmh) and rendezvous header (struct
// ibv_rvh), big-endian on the wire, read out of the staged message.
struct Tmh {
    uint8_t op = 0;
    uint32_t app_ctx = 0;
    uint64_t tag = 0;
};
struct Rvh {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t len = 0;
};
constexpr uint64_t kRvhBytes = 16;

template <typename T>
T load_be(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(v));
    if constexpr (sizeof(T) == 8) return be64toh(v);
    else return be32toh(v);
}

Tmh read_tmh(const uint8_t* m) { return Tmh{m[0], load_be<uint32_t>(m + 4), load_be<uint64_t>(m + 8)}; }
Rvh read_rvh(const uint8_t* m) {
    const uint8_t* r = m + abi::kTmHeaderBytes;
    return Rvh{load_be<uint64_t>(r), load_be<uint32_t>(r + 8), load_be<uint32_t>(r + 12)};
}

// Anonymous memory, never the guest's: staging cannot fault. It is
// charged to the guest as memory the shim maps for it (its MapBytes and
// Mappings quotas), so that QPs on TM SRQs cannot grow the shim past them.
std::shared_ptr<Mapping> make_staging(Context& ctx) {
    auto m = std::make_shared<Mapping>();
    m->charges.bind(ctx.charges.usage());
    if (!m->charges.take(Res::Mappings, 1, "a TM SRQ's staging") ||
        !m->charges.take(Res::MapBytes, kTmMaxMessageBytes, "a TM SRQ's staging"))
        return nullptr;
    void* p = ::mmap(nullptr, kTmMaxMessageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (p == MAP_FAILED) return nullptr;
    m->base = static_cast<uint8_t*>(p);
    m->len = kTmMaxMessageBytes;
    m->ring_safe = true;
    return m;
}

// Whether ordinary buffers are posted: 1 yes, 0 no, -1 the guest's
// producer index is invalid (the QP is put in error).
int ordinary_buffers(Context& ctx, Qp& qp, Srq& srq) {
    uint32_t n;
    if (!wq_pending(srq.wq, n)) {
        qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
        return -1;
    }
    return n ? 1 : 0;
}

// A tagged buffer's handle: its slot (from 1) and the slot's generation, so
// that the handle of an entry a message took names nothing once the slot
// holds another.
constexpr uint32_t kHandleIndexBits = 12;  // kTmMaxTags < 4096
constexpr uint32_t kHandleIndexMask = (1u << kHandleIndexBits) - 1;
static_assert(kTmMaxTags < kHandleIndexMask);
constexpr uint32_t make_handle(uint32_t index, uint32_t generation) {
    return (generation << kHandleIndexBits) | (index + 1);
}

bool any_tag_may_match(const TagList& l) {
    if (!l.synced()) return false;
    return std::any_of(l.entries.begin(), l.entries.end(), [](const TagEntry& e) { return e.used; });
}

// Of the tagged buffers that match `tag`, the one posted first.
TagEntry* match(TagList& l, uint64_t tag) {
    TagEntry* best = nullptr;
    for (TagEntry& e : l.entries)
        if (e.used && (tag & e.mask) == (e.tag & e.mask) && (!best || e.seq < best->seq)) best = &e;
    return best;
}

// The message's completion, from the one the responder prepared (its QP,
// source, immediate data).
void complete(Delivery& d, uint64_t wr_id, uint32_t status, uint32_t opcode, uint32_t byte_len, uint32_t tm_flags,
              uint64_t tag = 0, uint32_t priv = 0) {
    abi::Cqe c = d.cqe;
    c.wr_id = wr_id;
    c.status = status;
    c.opcode = opcode;
    c.byte_len = status == IBV_WC_SUCCESS ? byte_len : 0;
    c.wc_flags = status == IBV_WC_SUCCESS ? (c.wc_flags | tm_flags) : 0;
    c.tm_tag = tag;
    c.tm_priv = priv;
    c.tm_reserved = 0;
    cq_push(*d.ctx, d.recv_cq, c, d.solicited);
}

// Nothing to receive into: the sender is told to come back (its PSN is
// expected again).
void rnr(Delivery& d) {
    d.resp.syndrome = Syndrome::RnrNak;
    d.resp.rnr_timer = d.qp->attr.min_rnr_timer;
    d.qp->resp.epsn = d.resp.psn;
}

// The whole message into the next ordinary buffer, completed with `opcode`.
void deliver_ordinary(Delivery& d, Srq& srq, const uint8_t* msg, uint64_t len, uint32_t opcode, bool unexpected) {
    Context& ctx = *d.ctx;
    Qp& qp = *d.qp;
    const int bufs = ordinary_buffers(ctx, qp, srq);
    if (bufs < 0) {
        d.resp.syndrome = Syndrome::Drop;  // the QP just failed: the message is lost
        return;
    }
    if (bufs == 0) return rnr(d);
    RecvWork rw;
    Span spans[abi::kMaxSge];
    uint32_t n = 0;
    uint64_t cap = 0;
    uint32_t st = read_recv_wqe(srq.wq, srq.wq.cons, srq.max_sge, rw);
    if (st == IBV_WC_SUCCESS) st = resolve_sges(ctx, srq.pd, rw.sge, rw.num_sge, IBV_ACCESS_LOCAL_WRITE, spans, n, cap);
    wq_consume(srq.wq);
    srq_wqe_consumed(ctx, srq, 0);
    if (st == IBV_WC_SUCCESS && cap < len) st = IBV_WC_LOC_LEN_ERR;
    const Span src{const_cast<uint8_t*>(msg), len};
    if (st == IBV_WC_SUCCESS && len && copy_sg(spans, n, 0, &src, 1, len) != CopyFault::None) st = IBV_WC_LOC_PROT_ERR;
    if (st == IBV_WC_SUCCESS && unexpected) ++srq.tm->unexpected;
    complete(d, rw.wr_id, st, opcode, uint32_t(len), 0);
    if (st == IBV_WC_SUCCESS) return;
    // As any receive that fails (responder.cpp): the sender is NAKed and
    // both QPs go to error.
    d.resp.syndrome = st == IBV_WC_LOC_LEN_ERR ? Syndrome::NakInvReq : Syndrome::NakOp;
    qp_set_error(ctx, qp, st == IBV_WC_LOC_LEN_ERR ? IBV_EVENT_QP_REQ_ERR : IBV_EVENT_QP_FATAL);
}

// A tagged buffer's memory (the TM SRQ's PD, local write).
uint32_t resolve_tagged(Context& ctx, const Srq& srq, const TagEntry& e, Span* spans, uint32_t& n, uint64_t& cap) {
    return resolve_sges(ctx, srq.pd, e.sge, e.num_sge, IBV_ACCESS_LOCAL_WRITE, spans, n, cap);
}

void eager(Delivery& d, Srq& srq, const TagEntry& e, const Tmh& h, const uint8_t* msg, uint64_t len) {
    Span spans[abi::kMaxTmSge];
    uint32_t n = 0;
    uint64_t cap = 0;
    const uint64_t data = len - abi::kTmHeaderBytes;
    uint32_t st = resolve_tagged(*d.ctx, srq, e, spans, n, cap);
    if (st == IBV_WC_SUCCESS && cap < data) st = IBV_WC_LOC_LEN_ERR;
    const Span src{const_cast<uint8_t*>(msg), len};
    if (st == IBV_WC_SUCCESS && data &&
        copy_sg(spans, n, 0, &src, 1, abi::kTmHeaderBytes, data) != CopyFault::None)
        st = IBV_WC_LOC_PROT_ERR;
    complete(d, e.recv_wr_id, st, IBV_WC_TM_RECV, uint32_t(data), IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID, h.tag,
             h.app_ctx);
}

// The rendezvous FIN (the request's TMH and RVH, opcode FIN) to the
// sender's QP `sq`, into its next receive buffer, from QP `qpn` of a guest
// at `lid`. Without a receive posted it is lost (logged: a device would
// retry it after an RNR NAK).
void deliver_fin(Context& sctx, Qp& sq, const uint8_t* headers, uint32_t qpn, uint16_t lid) {
    uint8_t fin[abi::kTmHeaderBytes + kRvhBytes];
    std::memcpy(fin, headers, sizeof(fin));
    fin[0] = IBV_TMH_FIN;
    Srq* psrq = sq.srq ? sctx.srqs.get(sq.srq) : nullptr;
    if (psrq && psrq->feeds_device) return;
    WorkQueue& wq = psrq ? psrq->wq : sq.rq;
    uint32_t pending;
    if (!wq_pending(wq, pending)) return qp_set_error(sctx, sq, IBV_EVENT_QP_FATAL);
    if (pending == 0) {
        if (sq.resp.tm_fins_lost++ == 0)  // once a QP: a guest cannot flood the log
            LOG_WARN("context %llu: QP %u: rendezvous FIN from QP %u lost: no receive posted",
                     (unsigned long long)sctx.id(), sq.qpn, qpn);
        return;
    }
    RecvWork rw;
    Span spans[abi::kMaxSge];
    uint32_t n = 0;
    uint64_t cap = 0;
    const uint32_t max_sge = psrq ? psrq->max_sge : sq.max_recv_sge;
    uint32_t st = read_recv_wqe(wq, wq.cons, max_sge, rw);
    if (st == IBV_WC_SUCCESS) st = resolve_sges(sctx, sq.pd, rw.sge, rw.num_sge, IBV_ACCESS_LOCAL_WRITE, spans, n, cap);
    wq_consume(wq);
    if (psrq) srq_wqe_consumed(sctx, *psrq, 0);
    if (st == IBV_WC_SUCCESS && cap < sizeof(fin)) st = IBV_WC_LOC_LEN_ERR;
    const Span src{fin, sizeof(fin)};
    if (st == IBV_WC_SUCCESS && copy_sg(spans, n, 0, &src, 1, sizeof(fin)) != CopyFault::None)
        st = IBV_WC_LOC_PROT_ERR;
    abi::Cqe c{};
    c.wr_id = rw.wr_id;
    c.status = st;
    c.opcode = IBV_WC_RECV;
    c.byte_len = st == IBV_WC_SUCCESS ? uint32_t(sizeof(fin)) : 0;
    c.qp_num = sq.qpn;
    c.src_qp = qpn;
    c.slid = lid;
    const uint32_t cq = psrq && psrq->cq ? psrq->cq : sq.recv_cq;
    cq_push(sctx, cq, c);
}

// A matched rendezvous request: the match is reported now; the read, the
// FIN and the data completion run in the QP's next passes
// (tm_run_rendezvous), once the sender has seen its send complete. Data
// larger than the buffer is left to software: the headers go into the
// buffer with IBV_WC_TM_RNDV_INCOMPLETE, as the verbs allow.
void rendezvous(Delivery& d, Srq& srq, const TagEntry& e, const Tmh& h, const uint8_t* msg, uint64_t len) {
    Context& ctx = *d.ctx;
    Span spans[abi::kMaxTmSge];
    uint32_t n = 0;
    uint64_t cap = 0;
    const uint32_t st = resolve_tagged(ctx, srq, e, spans, n, cap);
    if (st != IBV_WC_SUCCESS) return complete(d, e.recv_wr_id, st, IBV_WC_TM_RECV, 0, 0);
    const Rvh r = read_rvh(msg);
    if (r.len > cap) {
        const uint64_t put = std::min<uint64_t>(len, cap);
        const Span src{const_cast<uint8_t*>(msg), len};
        uint32_t s = IBV_WC_TM_RNDV_INCOMPLETE;
        if (put && copy_sg(spans, n, 0, &src, 1, put) != CopyFault::None) s = IBV_WC_LOC_PROT_ERR;
        abi::Cqe c = d.cqe;
        c.wr_id = e.recv_wr_id;
        c.status = s;
        c.opcode = IBV_WC_TM_RECV;
        c.byte_len = uint32_t(put);
        c.wc_flags = IBV_WC_TM_MATCH;
        c.tm_tag = h.tag;
        c.tm_priv = h.app_ctx;
        c.tm_reserved = 0;
        cq_push(ctx, d.recv_cq, c, d.solicited);
        return;
    }
    complete(d, e.recv_wr_id, IBV_WC_SUCCESS, IBV_WC_TM_RECV, 0, IBV_WC_TM_MATCH, h.tag, h.app_ctx);
    Qp& qp = *d.qp;
    if (qp.resp.tm_rendezvous.capacity() == 0) qp.resp.tm_rendezvous.reserve(8);
    PendingRendezvous& p = qp.resp.tm_rendezvous.emplace_back();
    p.cqe = d.cqe;
    p.sender_incarnation = qp.peer_incarnation;
    p.cq = d.recv_cq;
    p.srq = qp.srq;
    p.recv_wr_id = e.recv_wr_id;
    p.num_sge = e.num_sge;
    std::copy(e.sge, e.sge + e.num_sge, p.sge);
    std::memcpy(p.headers, msg, sizeof(p.headers));
    // A sender this worker does not serve is read through the QP's
    // transport, a piece per request; its pieces and FIN take the QP's next
    // rendezvous PSNs.
    p.remote = !d.eng->serves(d.cqe.slid);
    if (p.remote) {
        p.pieces = uint32_t((r.len + TurnScheduler::kSliceBytes - 1) / TurnScheduler::kSliceBytes);
        p.first_psn = qp.resp.tm_next_psn;
        qp.resp.tm_next_psn = (qp.resp.tm_next_psn + p.pieces + 1) & kPsnMask;
    }
    ctx.mark_work(qp);
}

// The data completion of a matched rendezvous, status and length to fill.
abi::Cqe rendezvous_cqe(const PendingRendezvous& p) {
    abi::Cqe c = p.cqe;
    c.wr_id = p.recv_wr_id;
    c.opcode = IBV_WC_TM_RECV;
    c.wc_flags = 0;
    c.byte_len = 0;
    c.tm_tag = 0;
    c.tm_priv = c.tm_reserved = 0;
    return c;
}

// Reads the next slices of a matched rendezvous while the turn lasts (a
// slice at a time, charged as any copy: engine.h "Work per turn"). True
// once it is done: the FIN sent and the data completion written.
bool step_rendezvous(Engine& eng, Context& ctx, Qp& qp, PendingRendezvous& p) {
    abi::Cqe c = rendezvous_cqe(p);
    const Rvh r = read_rvh(p.headers);
    Srq* srq = ctx.srqs.get(p.srq);
    Span spans[abi::kMaxTmSge];
    uint32_t n = 0;
    uint64_t cap = 0;
    uint32_t st = srq ? resolve_sges(ctx, srq->pd, p.sge, p.num_sge, IBV_ACCESS_LOCAL_WRITE, spans, n, cap)
                      : uint32_t(IBV_WC_LOC_QP_OP_ERR);
    if (st == IBV_WC_SUCCESS && cap < r.len) st = IBV_WC_LOC_LEN_ERR;  // its MR changed meanwhile
    // The sending QP as the READ from this QP would reach it: the same one,
    // still connected. Gone or failed, its answer never comes.
    QpRef peer = eng.qpns().find(c.slid, c.src_qp);
    const bool sender_there = peer && peer.qp->type == IBV_QPT_RC && peer.qp->incarnation == p.sender_incarnation &&
                              qp_takes_requests(peer.qp->state);
    if (st == IBV_WC_SUCCESS && !sender_there) st = IBV_WC_REM_ABORT_ERR;
    while (st == IBV_WC_SUCCESS && p.done < r.len) {
        if (eng.turns().spent()) return false;
        Qp& sq = *peer.qp;
        const uint64_t slice = std::min<uint64_t>(TurnScheduler::kCopySlice, r.len - p.done);
        uint8_t* src = (sq.attr.qp_access_flags & IBV_ACCESS_REMOTE_READ)
                           ? resolve_rkey(*peer.ctx, sq, sq.pd, r.rkey, r.va + p.done, slice, IBV_ACCESS_REMOTE_READ)
                           : nullptr;
        const Span s{src, slice};
        const uint64_t t0 = eng.now();
        const CopyFault f = src ? copy_sg(spans, n, p.done, &s, 1, slice) : CopyFault::Src;
        eng.turns().charge_copy(slice, eng.now() - t0);
        if (f == CopyFault::Dst) st = IBV_WC_LOC_PROT_ERR;
        if (f == CopyFault::Src) st = IBV_WC_REM_ACCESS_ERR;
        p.done += slice;
    }
    if (st == IBV_WC_SUCCESS) {
        deliver_fin(*peer.ctx, *peer.qp, p.headers, qp.qpn, uint16_t(ctx.guest().lid));
        c.wc_flags = IBV_WC_TM_DATA_VALID;
        c.byte_len = r.len;
    }
    c.status = st;
    cq_push(ctx, p.cq, c);
    return true;
}

// ---------------------------------------------------------------------------
// A sender on another worker or shim: the read goes as kTmRndvRead requests
// of at most TurnScheduler::kSliceBytes (request.h), a few in flight, answered in
// order; once every piece is in, the data completion is written and the FIN
// goes as a kTmRndvFin. The QP's peer is one QP, so one reliable, ordered
// stream carries every piece.
// ---------------------------------------------------------------------------

constexpr uint32_t kPiecesInFlight = 4;  // per QP

uint32_t pieces_in_flight(const Qp& qp) {
    uint32_t n = 0;
    for (const PendingRendezvous& p : qp.resp.tm_rendezvous) n += p.asked - p.answered;
    return n;
}

// Piece `k`'s part of the tagged buffer, as spans (`pins`: their mappings).
uint32_t piece_target(Context& ctx, const PendingRendezvous& p, uint32_t k, Span* out, uint32_t& n, uint64_t& len,
                      Pins* pins) {
    Srq* srq = ctx.srqs.get(p.srq);
    if (!srq) return IBV_WC_LOC_QP_OP_ERR;
    Span all[abi::kMaxTmSge];
    uint32_t na = 0;
    uint64_t cap = 0;
    uint32_t st = resolve_sges(ctx, srq->pd, p.sge, p.num_sge, IBV_ACCESS_LOCAL_WRITE, all, na, cap, pins);
    const uint64_t total = read_rvh(p.headers).len;
    if (st == IBV_WC_SUCCESS && cap < total) st = IBV_WC_LOC_LEN_ERR;  // its MR changed meanwhile
    if (st != IBV_WC_SUCCESS) return st;
    const uint64_t off = uint64_t(k) * TurnScheduler::kSliceBytes;
    len = std::min<uint64_t>(TurnScheduler::kSliceBytes, total - off);
    n = 0;
    uint64_t skip = off, want = len;
    for (uint32_t i = 0; i < na && want; ++i) {
        if (skip >= all[i].len) {
            skip -= all[i].len;
            continue;
        }
        const uint64_t take = std::min(all[i].len - skip, want);
        out[n++] = Span{all[i].p + skip, take};
        want -= take;
        skip = 0;
    }
    return IBV_WC_SUCCESS;
}

// The data is in: the DATA_VALID completion, and the FIN is next.
void data_arrived(Context& ctx, Qp& qp, PendingRendezvous& p) {
    abi::Cqe c = rendezvous_cqe(p);
    c.wc_flags = IBV_WC_TM_DATA_VALID;
    c.byte_len = read_rvh(p.headers).len;
    cq_push(ctx, p.cq, c);
    p.fin_due = true;
    ctx.mark_work(qp);
}

// The rendezvous failed: its data completion says how.
void rendezvous_failed(Context& ctx, PendingRendezvous& p, uint32_t status) {
    abi::Cqe c = rendezvous_cqe(p);
    c.status = status;
    cq_push(ctx, p.cq, c);
}

uint32_t status_of(const Response& r) {
    switch (r.syndrome) {
    case Syndrome::NakAccess:
        return IBV_WC_REM_ACCESS_ERR;
    case Syndrome::NakInvReq:
        return IBV_WC_REM_INV_REQ_ERR;
    case Syndrome::LocalFault:
        return IBV_WC_LOC_PROT_ERR;
    case Syndrome::Drop:  // the sending QP is gone, reset, or another one
        return IBV_WC_REM_ABORT_ERR;
    default:
        return IBV_WC_REM_OP_ERR;
    }
}

// Answer `k` of `p` (`local_error`: its data could not be written here).
// True once `p` is finished (failed).
bool take_answer(Engine& eng, Context& ctx, Qp& qp, PendingRendezvous& p, const Response& r, uint32_t local_error) {
    uint32_t st = local_error;
    if (!st && r.syndrome != Syndrome::Ack) st = status_of(r);
    if (st != IBV_WC_SUCCESS) {
        rendezvous_failed(ctx, p, st);
        return true;
    }
    ++p.answered;
    p.since_ns = eng.now();  // progress: the timer of what is still in flight starts again
    if (p.answered == p.pieces)
        data_arrived(ctx, qp, p);
    else
        ctx.mark_work(qp);  // room for another piece
    return false;
}

// The rendezvous of `qp` whose next answer is PSN `psn`, and that piece.
PendingRendezvous* awaiting(Qp& qp, uint32_t psn, uint32_t& k) {
    for (PendingRendezvous& p : qp.resp.tm_rendezvous) {
        if (!p.remote || p.answered == p.asked) continue;
        if (((psn - p.first_psn) & kPsnMask) != p.answered) return nullptr;  // answers come in order
        k = p.answered;
        return &p;
    }
    return nullptr;
}

enum class RemoteStep { Finished, Waiting, Stop };

// Sends what `p` may send now: pieces while the window allows, or the FIN.
RemoteStep step_remote(Engine& eng, Context& ctx, Qp& qp, PendingRendezvous& p) {
    Transport* t = requester_route(eng, qp);
    const uint64_t now = eng.now();
    if (p.asked > p.answered) {
        // No answer for the QP's timeout, from a transport that is not
        // still delivering: the sender's shim is gone.
        const uint64_t due = p.since_ns + ack_timeout_ns(qp.attr.timeout);
        if (now >= due && !(t && t->delivering_since(p.since_ns))) {
            rendezvous_failed(ctx, p, IBV_WC_REM_ABORT_ERR);
            return RemoteStep::Finished;
        }
        ctx.note_deadline(now >= due ? now + ack_timeout_ns(qp.attr.timeout) : due);
    }
    if (!t) {  // no way to the sender any more
        if (!p.fin_due) rendezvous_failed(ctx, p, IBV_WC_REM_ABORT_ERR);
        return RemoteStep::Finished;
    }
    if (p.pieces == 0 && !p.fin_due) data_arrived(ctx, qp, p);
    const Rvh r = read_rvh(p.headers);
    Request req;
    req.qp_type = IBV_QPT_RC;
    requester_stamp(ctx, qp, req);
    req.dlid = qp.attr.ah.dlid;
    req.dqpn = qp.attr.dest_qp_num;
    req.sl = qp.attr.ah.sl;
    Response resp;
    if (p.fin_due) {
        req.opcode = kTmRndvFin;
        req.psn = (p.first_psn + p.pieces) & kPsnMask;
        std::memcpy(req.sgid, p.headers, 16);
        std::memcpy(req.dgid, p.headers + 16, 16);
        // Sent once: the stream is reliable, and an answer changes nothing.
        return t->send(eng, ctx, qp, req, nullptr, 0, nullptr, resp) == SendResult::Busy ? RemoteStep::Stop
                                                                                           : RemoteStep::Finished;
    }
    req.opcode = kTmRndvRead;
    req.rkey = r.rkey;
    while (p.asked < p.pieces && pieces_in_flight(qp) < kPiecesInFlight) {
        if (eng.turns().spent()) return RemoteStep::Stop;
        Span spans[abi::kMaxTmSge];
        uint32_t n = 0;
        uint64_t len = 0;
        Pins* pins = t->keeps_memory() ? &eng.scratch_pins() : nullptr;
        if (pins) pins->clear();
        const uint32_t st = piece_target(ctx, p, p.asked, spans, n, len, pins);
        if (st != IBV_WC_SUCCESS) {
            rendezvous_failed(ctx, p, st);
            return RemoteStep::Finished;
        }
        req.psn = (p.first_psn + p.asked) & kPsnMask;
        req.remote_addr = r.va + uint64_t(p.asked) * TurnScheduler::kSliceBytes;
        req.length = len;
        const SendResult sent = t->send(eng, ctx, qp, req, spans, n, pins, resp);
        if (sent == SendResult::Busy) return RemoteStep::Stop;  // the transport wakes the QP when it has room
        eng.turns().charge(TurnScheduler::kWqeCost);
        if (p.asked++ == p.answered) p.since_ns = now;
        if (sent == SendResult::Done && take_answer(eng, ctx, qp, p, resp, 0)) return RemoteStep::Finished;
    }
    if (p.asked > p.answered) ctx.note_deadline(p.since_ns + ack_timeout_ns(qp.attr.timeout));
    return RemoteStep::Waiting;
}

}  // namespace

TmBegin tm_begin(Engine& eng, const Request& req, Context& ctx, Qp& qp, Srq& srq, Delivery& d, Pins* pins) {
    if (req.length > kTmMaxMessageBytes) return TmBegin::TooLong;
    const int bufs = ordinary_buffers(ctx, qp, srq);
    if (bufs < 0) return TmBegin::Error;
    if (bufs == 0 && !any_tag_may_match(*srq.tm)) return TmBegin::Rnr;
    // A message still streaming into the staging buffer (from another link
    // of the fabric) keeps it: this one gets a new one, and the old one
    // lives while that transfer's pins do.
    if (!qp.resp.tm_staging || qp.resp.tm_staging_busy) {
        std::shared_ptr<Mapping> m = make_staging(ctx);
        if (!m) return TmBegin::NoMemory;
        qp.resp.tm_staging = std::move(m);
    }
    qp.resp.tm_staging_busy = true;
    d.spans[0] = Span{qp.resp.tm_staging->base, req.length};
    d.nspans = req.length ? 1 : 0;
    if (pins) pins->add(qp.resp.tm_staging);
    d.tm = true;
    d.eng = &eng;
    d.incarnation = qp.peer_incarnation;
    d.recv_cq = srq.cq;
    return TmBegin::Staged;
}

void tm_finish(Delivery& d, bool payload_ok) {
    d.recv_cqe = false;
    Context& ctx = *d.ctx;
    Qp& qp = *d.qp;
    const uint8_t* msg = d.spans[0].p;  // this message's staging buffer
    if (qp.resp.tm_staging && msg == qp.resp.tm_staging->base) qp.resp.tm_staging_busy = false;
    if (!payload_ok) {  // it never arrived whole: nothing was taken, the QP fails
        d.resp.syndrome = Syndrome::Drop;
        return qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
    }
    // Flushed, failed, reset or bound to another peer meanwhile: the
    // message is lost and nothing is taken.
    if (d.cqe.status != IBV_WC_SUCCESS || !qp_takes_requests(qp.state) || qp.peer_incarnation != d.incarnation) {
        d.resp.syndrome = Syndrome::Drop;
        return;
    }
    Srq* srq = qp.srq ? ctx.srqs.get(qp.srq) : nullptr;
    if (!srq || !srq->tm) return;  // an SRQ with QPs is never destroyed
    const uint64_t len = d.length;
    const bool has_tmh = len >= abi::kTmHeaderBytes;
    const Tmh h = has_tmh ? read_tmh(msg) : Tmh{};
    const bool eager_msg = has_tmh && h.op == IBV_TMH_EAGER;
    const bool rndv_msg = has_tmh && h.op == IBV_TMH_RNDV && len >= abi::kTmHeaderBytes + kRvhBytes;
    if (!eager_msg && !rndv_msg) {
        // NO_TAG, a FIN, or no header at all: software's, as it came.
        const uint32_t op = has_tmh && h.op == IBV_TMH_NO_TAG ? IBV_WC_TM_NO_TAG : IBV_WC_RECV;
        return deliver_ordinary(d, *srq, msg, len, op, false);
    }
    TagEntry* e = srq->tm->synced() ? match(*srq->tm, h.tag) : nullptr;
    if (!e) return deliver_ordinary(d, *srq, msg, len, IBV_WC_TM_RECV, true);
    const TagEntry entry = *e;
    e->used = false;  // consumed: a later DEL of its handle fails with IBV_WC_TM_ERR
    ++e->generation;
    if (eager_msg)
        eager(d, *srq, entry, h, msg, len);
    else
        rendezvous(d, *srq, entry, h, msg, len);
}

void tm_run_rendezvous(Engine& eng, Context& ctx, Qp& qp) {
    // In order: a direct read runs while the turn lasts; a remote one sends
    // what it may and the next one goes on (its pieces wait behind it).
    std::vector<PendingRendezvous>& v = qp.resp.tm_rendezvous;
    size_t kept = 0;
    bool stopped = false;
    for (size_t i = 0; i < v.size(); ++i) {
        bool finished = false;
        if (!stopped) {
            if (!v[i].remote) {
                finished = step_rendezvous(eng, ctx, qp, v[i]);
                stopped = !finished;
            } else {
                const RemoteStep s = step_remote(eng, ctx, qp, v[i]);
                finished = s == RemoteStep::Finished;
                stopped = s == RemoteStep::Stop || (s == RemoteStep::Waiting && v[i].asked < v[i].pieces);
            }
        }
        if (finished) continue;
        if (kept != i) v[kept] = v[i];
        ++kept;
    }
    v.resize(kept);
    if (stopped && eng.turns().spent()) ctx.mark_skipped(qp);  // the turn is spent: the rest on the next pass
}

void tm_answered(Engine& eng, Context& ctx, Qp& qp, const Response& resp, uint32_t local_error) {
    uint32_t k = 0;
    PendingRendezvous* p = awaiting(qp, resp.psn, k);
    if (!p || !take_answer(eng, ctx, qp, *p, resp, local_error)) return;
    qp.resp.tm_rendezvous.erase(qp.resp.tm_rendezvous.begin() + (p - qp.resp.tm_rendezvous.data()));
}

uint32_t tm_read_target(Context& ctx, Qp& qp, uint32_t psn, Span* out, uint32_t& spans, uint64_t& len, Pins* pins) {
    uint32_t k = 0;
    PendingRendezvous* p = awaiting(qp, psn, k);
    if (!p || k >= p->pieces) return IBV_WC_LOC_QP_OP_ERR;
    return piece_target(ctx, *p, k, out, spans, len, pins);
}

void tm_deliver_fin(Context& sctx, Qp& sq, const uint8_t* headers, uint32_t qpn, uint16_t lid) {
    deliver_fin(sctx, sq, headers, qpn, lid);
}

void tm_flush_rendezvous(Context& ctx, Qp& qp) {
    for (const PendingRendezvous& p : qp.resp.tm_rendezvous) {
        abi::Cqe c = rendezvous_cqe(p);
        c.status = IBV_WC_WR_FLUSH_ERR;
        cq_push(ctx, p.cq, c);
    }
    qp.resp.tm_rendezvous.clear();
}

int tm_list_op(Context& ctx, Srq& srq, const abi::CmdTmOpReq& op, uint32_t& handle) {
    TagList& l = *srq.tm;
    if (op.flags & ~uint32_t(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC)) return EINVAL;
    uint32_t status = IBV_WC_SUCCESS;
    uint32_t wc_opcode = 0;
    switch (op.opcode) {
    case IBV_WR_TAG_ADD: {
        if (op.num_sge > abi::kMaxTmSge) return EINVAL;
        Span spans[abi::kMaxTmSge];
        uint32_t n = 0;
        uint64_t cap = 0;
        if (resolve_sges(ctx, srq.pd, op.sge, op.num_sge, IBV_ACCESS_LOCAL_WRITE, spans, n, cap) != IBV_WC_SUCCESS)
            return EINVAL;
        auto free_slot = std::find_if(l.entries.begin(), l.entries.end(), [](const TagEntry& e) { return !e.used; });
        if (free_slot == l.entries.end()) return ENOMEM;  // max_num_tags are posted
        TagEntry& e = *free_slot;
        e.used = true;
        e.seq = l.next_seq++;
        e.tag = op.tag;
        e.mask = op.mask;
        e.recv_wr_id = op.recv_wr_id;
        e.num_sge = op.num_sge;
        std::copy(op.sge, op.sge + op.num_sge, e.sge);
        handle = make_handle(uint32_t(free_slot - l.entries.begin()), e.generation);
        wc_opcode = IBV_WC_TM_ADD;
        break;
    }
    case IBV_WR_TAG_DEL: {
        const uint32_t index = (op.handle & kHandleIndexMask) - 1;
        if ((op.handle & kHandleIndexMask) == 0 || index >= l.entries.size()) return EINVAL;
        TagEntry& e = l.entries[index];
        if (e.used && op.handle == make_handle(index, e.generation)) {
            e.used = false;
            ++e.generation;
        } else {
            status = IBV_WC_TM_ERR;  // a message took it meanwhile (its slot may hold a newer entry)
        }
        wc_opcode = IBV_WC_TM_DEL;
        break;
    }
    case IBV_WR_TAG_SYNC:
        wc_opcode = IBV_WC_TM_SYNC;
        break;
    default:
        return EINVAL;
    }
    if (op.flags & IBV_OPS_TM_SYNC) l.reported = op.unexpected_cnt;
    if ((op.flags & IBV_OPS_SIGNALED) || status != IBV_WC_SUCCESS) {
        abi::Cqe c{};
        c.wr_id = op.wr_id;
        c.status = status;
        c.opcode = wc_opcode;
        if (!l.synced()) c.wc_flags = IBV_WC_TM_SYNC_REQ;
        cq_push(ctx, srq.cq, c);
    }
    return 0;
}

}  // namespace vrdma::shim
