#include "local_transport.h"

#include <infiniband/verbs.h>

#include <algorithm>

#include "engine.h"
#include "responder.h"

namespace vrdma::shim {

// A large transfer in progress: the request it carries (the requester builds
// it again from the same WQE at every turn: it must not change), the
// responder's decision and pinned memory, and how far the copy got.
struct SlicedCopy {
    bool active = false;
    Request req;
    Delivery d;
    Pins target;
    uint64_t done = 0;
};

void SlicedCopyDeleter::operator()(SlicedCopy* s) const { delete s; }

namespace {

// The transfer is over (done, failed or abandoned): its pins go.
void end_transfer(SlicedCopy& s) {
    s.active = false;
    s.target.clear();
}

bool sliceable(const Request& req) {
    return req.length > Engine::kSliceBytes && req.qp_type != IBV_QPT_UD &&
           (request_carries_payload(req.opcode) || req.opcode == IBV_WR_RDMA_READ);
}

bool same_request(const Request& a, const Request& b) {
    return a.psn == b.psn && a.opcode == b.opcode && a.length == b.length && a.rkey == b.rkey &&
           a.remote_addr == b.remote_addr && a.dlid == b.dlid && a.dqpn == b.dqpn;
}

// Moves `bytes` of the payload from offset `at`. A page the guest took away
// under the copy (fault_guard.h) fails the side it belonged to: the
// requester's memory gives it IBV_WC_LOC_PROT_ERR (the receive, if one was
// taken, never gets its payload), the responder's an access NAK. Returns
// false then, with d.resp saying so.
bool move_payload(const Request& req, Delivery& d, const Span* local, uint32_t nlocal, uint64_t at,
                  uint64_t bytes) {
    const bool read = req.opcode == IBV_WR_RDMA_READ;
    CopyFault f = read ? copy_sg(local, nlocal, at, d.spans, d.nspans, at, bytes)
                       : copy_sg(d.spans, d.nspans, d.skip + at, local, nlocal, at, bytes);
    if (f == CopyFault::None) return true;
    const bool local_fault = f == (read ? CopyFault::Dst : CopyFault::Src);
    if (!local_fault) {
        responder_memory_fault(d);
    } else {
        if (req.qp_type == IBV_QPT_RC)
            responder_finish(d, false);
        else
            responder_memory_fault(d);
        d.resp.syndrome = Syndrome::LocalFault;
    }
    return false;
}

// move_payload, charged to the turn (engine.h: by its time when large).
bool timed_move(Engine& eng, const Request& req, Delivery& d, const Span* local, uint32_t nlocal, uint64_t at,
                uint64_t bytes) {
    const bool timed = bytes >= Engine::kTimedCopyBytes;
    const uint64_t t0 = timed ? eng.now() : 0;
    const bool moved = move_payload(req, d, local, nlocal, at, bytes);
    eng.charge_copy(bytes, timed ? eng.now() - t0 : 0);
    eng.local_transport().count_copy(bytes);
    return moved;
}

}  // namespace

SendResult LocalTransport::send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local,
                                uint32_t nlocal, Pins*, Response& resp) {
    SlicedCopy* s = qp.sliced.get();
    if (s && s->active && !same_request(s->req, req)) abandon(eng, qp);  // the guest rewrote its WQE
    if (!s || !s->active) {
        if (!sliceable(req)) {
            Delivery d;
            responder_begin(eng, req, d);
            if (d.resp.syndrome == Syndrome::Ack && d.length) timed_move(eng, req, d, local, nlocal, 0, d.length);
            responder_finish(d);
            resp = d.resp;
            return SendResult::Done;
        }
        if (!s) qp.sliced.reset(s = new SlicedCopy);
        s->req = req;
        s->d.reset();
        s->target.clear();
        s->done = 0;
        responder_begin(eng, req, s->d, &s->target);
        if (s->d.resp.syndrome != Syndrome::Ack || s->d.length == 0) {
            responder_finish(s->d);
            resp = s->d.resp;
            s->target.clear();
            return SendResult::Done;
        }
        s->active = true;
    } else if (!responder_revalidate(eng, s->d) || s->d.qp->state == IBV_QPS_ERR) {
        // The responder QP went away or into error meanwhile: the rest is
        // lost, and the requester's retries find nobody (RETRY_EXC_ERR).
        if (s->d.qp) {
            s->d.cqe.status = IBV_WC_WR_FLUSH_ERR;
            s->d.cqe.byte_len = 0;
            s->d.cqe.wc_flags = 0;
        }
        responder_finish(s->d);
        end_transfer(*s);
        resp = Response{};
        resp.syndrome = Syndrome::Drop;
        resp.psn = req.psn;
        return SendResult::Done;
    }
    // Slices while the turn lasts (at least one: every turn makes progress).
    bool moved = true;
    do {
        const uint64_t n = std::min(Engine::kSliceBytes, s->d.length - s->done);
        moved = timed_move(eng, req, s->d, local, nlocal, s->done, n);
        s->done += n;
    } while (moved && s->done < s->d.length && !eng.turn_spent());
    if (moved && s->done < s->d.length) {
        ctx.mark_work(qp);  // the next slice on the next pass
        return SendResult::Busy;
    }
    responder_finish(s->d);
    resp = s->d.resp;
    end_transfer(*s);
    return SendResult::Done;
}

void LocalTransport::abandon(Engine& eng, Qp& qp) {
    SlicedCopy* s = qp.sliced.get();
    if (!s || !s->active) return;
    if (responder_revalidate(eng, s->d)) responder_finish(s->d, false);
    end_transfer(*s);
}

}  // namespace vrdma::shim
