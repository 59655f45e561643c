#include "local_transport.h"

#include <infiniband/verbs.h>

#include <algorithm>

#include "engine.h"
#include "payload_move.h"
#include "responder.h"
#include "sliced_transfer.h"

namespace vrdma::shim {

namespace {

// The transfer is over (done, failed or abandoned): its pins go.
void end_transfer(SlicedCopy& s) {
    s.active = false;
    s.target.clear();
}

}  // namespace

SendResult LocalTransport::send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local,
                                uint32_t nlocal, Pins*, Response& resp) {
    SlicedCopy* s = qp.req.sliced.get();
    if (s && s->active && !same_request(s->req, req)) abandon_transfer(eng, qp);  // the guest rewrote its WQE
    if (!s || !s->active) {
        if (!sliceable(req)) {
            Delivery d;
            responder_begin(eng, req, d);
            if (d.resp.syndrome == Syndrome::Ack && d.length)
                timed_move(eng, req, d, local, nlocal, 0, d.length, copied_bytes_);
            responder_finish(d);
            resp = d.resp;
            return SendResult::Done;
        }
        s = &sliced_state(qp);
        s->owner = this;
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
    } else if (!responder_still_there(eng, s->d, req.psn)) {
        resp = s->d.resp;
        end_transfer(*s);
        return SendResult::Done;
    }
    // Slices while the turn lasts (at least one: every turn makes progress).
    bool moved = true;
    do {
        const uint64_t n = std::min(TurnScheduler::kCopySlice, s->d.length - s->done);
        moved = timed_move(eng, req, s->d, local, nlocal, s->done, n, copied_bytes_);
        s->done += n;
    } while (moved && s->done < s->d.length && !eng.turns().spent());
    if (moved && s->done < s->d.length) {
        ctx.mark_work(qp);  // the next slice on the next pass
        return SendResult::Busy;
    }
    responder_finish(s->d);
    resp = s->d.resp;
    end_transfer(*s);
    return SendResult::Done;
}

bool LocalTransport::send_copy(Engine& eng, const Request& req, const uint8_t* payload) {
    Delivery d;
    responder_begin(eng, req, d);
    const Span src{const_cast<uint8_t*>(payload), req.length};
    if (d.resp.syndrome == Syndrome::Ack && d.length) timed_move(eng, req, d, &src, 1, 0, d.length, copied_bytes_);
    responder_finish(d);
    return true;
}

void LocalTransport::abandon(Engine& eng, Qp& qp) {
    SlicedCopy* s = qp.req.sliced.get();
    if (!s || !s->active) return;
    responder_revalidate(eng, s->d);
    responder_end(s->d, PayloadEnd::Lost);
    end_transfer(*s);
}

}  // namespace vrdma::shim
