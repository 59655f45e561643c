#include "worker_link.h"

#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "engine.h"
#include "multicast_delivery.h"
#include "multicast_groups.h"
#include "payload_move.h"
#include "requester.h"
#include "sliced_transfer.h"
#include "tag_matching.h"

namespace vrdma::shim {

void WorkerWake::kick() {
    // Pairs with the worker's seq_cst store of `asleep` before its last
    // look at the rings (worker.cpp): one of the two sees the other.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!asleep.load(std::memory_order_relaxed) || !fd) return;
    const uint64_t one = 1;
    (void)::write(fd.get(), &one, sizeof(one));  // a full counter is still readable: it wakes
}

WorkerLink::WorkerLink(Engine& eng, uint32_t self, uint32_t peer, WorkerInbox& peer_inbox)
    : eng_(eng), self_(self), peer_(peer), out_(peer_inbox) {}

WorkerLink::~WorkerLink() { forget_transfers(eng_, this); }

WorkerMsg* WorkerLink::claim() {
    reserved_ = out_.ring.claim(reserved_pos_);
    return reserved_;
}

void WorkerLink::publish() {
    reserved_->from = self_;
    reserved_ = nullptr;
    out_.ring.publish(reserved_pos_);
    out_.wake.kick();
}

WorkerMsg& WorkerLink::answer_slot() {
    reserved_ = nullptr;
    if (waiting_.empty()) claim();
    return reserved_ ? *reserved_ : waiting_.emplace_back();
}

void WorkerLink::commit(WorkerMsg& m) {
    if (&m == reserved_) publish();  // otherwise it waits in waiting_ for room
}

bool WorkerLink::flush() {
    bool sent = false;
    while (!waiting_.empty() && claim()) {
        *reserved_ = std::move(waiting_.front());
        waiting_.pop_front();
        publish();
        sent = true;
    }
    return sent;
}

void WorkerLink::fill_request(WorkerMsg& m, const Request& req, const Span* local, uint32_t nlocal, Pins* pins) {
    m.kind = WorkerMsg::Kind::Request;
    m.req = req;
    m.req.wqe = nullptr;  // the sender's scratch: not valid in another thread
    m.offset = 0;
    m.bytes = request_reads(req.opcode) || request_carries_payload(req.opcode) ? req.length : 0;
    m.first = m.last = true;
    m.pins.clear();
    if (req.inline_payload) {
        // Inline data lives in the sender's scratch memory (a multicast
        // copy's in the engine's multicast buffer): it travels in the
        // message (on_request points local[0] at it).
        uint8_t* room = m.payload_room(req.length);
        uint64_t at = 0;
        for (uint32_t i = 0; i < nlocal; ++i) {
            std::memcpy(room + at, local[i].p, local[i].len);
            at += local[i].len;
        }
        m.nlocal = 0;
    } else {
        std::copy(local, local + nlocal, m.local);
        m.nlocal = nlocal;
        if (pins) m.pins.take(*pins);
    }
}

SendResult WorkerLink::send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local,
                            uint32_t nlocal, Pins* pins, Response&) {
    SlicedCopy* s = qp.req.sliced.get();
    // A rendezvous request (tag_matching.h) goes whole between the slices
    // of the requester's transfer, which it leaves alone.
    if (s && s->active && !is_tm_request(req.opcode) && (s->owner != this || !same_request(s->req, req)))
        abandon_transfer(eng, qp);
    // What waits for room goes first: a request must not pass an Abort.
    flush();
    if (!waiting_.empty()) {
        ++stats_.ring_full;
        ctx.mark_work(qp);  // offered again on the next pass
        return SendResult::Busy;
    }
    if (!sliceable(req)) {
        WorkerMsg* m = claim();
        if (!m) {
            ++stats_.ring_full;
            ctx.mark_work(qp);
            return SendResult::Busy;
        }
        fill_request(*m, req, local, nlocal, pins);
        eng.turns().charge(m->bytes);
        publish();
        ++stats_.requests_out;
        return SendResult::InFlight;
    }
    // In slices, handed over while the turn lasts (at least one a turn when
    // the ring has room); the first carries the pins of `local`, which stay
    // with the other worker until the answer.
    s = &sliced_state(qp);
    if (!s->active) {
        s->owner = this;
        s->req = req;
        s->done = 0;
        s->active = true;
    }
    do {
        WorkerMsg* m = claim();
        if (!m) {
            ++stats_.ring_full;
            break;
        }
        const uint64_t n = std::min(TurnScheduler::kSliceBytes, req.length - s->done);
        fill_request(*m, req, local, nlocal, s->done == 0 ? pins : nullptr);
        m->offset = s->done;
        m->bytes = n;
        m->first = s->done == 0;
        m->last = s->done + n == req.length;
        publish();
        ++stats_.requests_out;
        s->done += n;
        eng.turns().charge(n);
    } while (s->done < req.length && !eng.turns().spent());
    if (s->done < req.length) {
        ctx.mark_work(qp);  // the next slices on the next pass
        return SendResult::Busy;
    }
    s->active = false;
    return SendResult::InFlight;
}

bool WorkerLink::send_copy(Engine&, const Request& req, const uint8_t* payload) {
    flush();
    WorkerMsg* m = waiting_.empty() ? claim() : nullptr;
    if (!m) {
        ++stats_.ring_full;
        return false;
    }
    const Span src{const_cast<uint8_t*>(payload), req.length};
    fill_request(*m, req, &src, req.length ? 1 : 0, nullptr);
    publish();
    ++stats_.requests_out;
    return true;
}

void WorkerLink::abandon(Engine&, Qp& qp) {
    SlicedCopy* s = qp.req.sliced.get();
    if (!s || !s->active) return;
    s->active = false;
    if (s->done == 0) return;  // nothing was handed over
    WorkerMsg& m = answer_slot();
    m.kind = WorkerMsg::Kind::Abort;
    m.lid = s->req.slid;
    m.qpn = s->req.sqpn;
    m.pins.clear();
    commit(m);
}

void WorkerLink::qp_gone(uint16_t lid, uint32_t qpn, uint16_t peer_lid, uint32_t peer_qpn, int event) {
    WorkerMsg& m = answer_slot();
    m.kind = WorkerMsg::Kind::QpGone;
    m.event = event;
    m.lid = peer_lid;  // the survivor, on the other worker
    m.qpn = peer_qpn;
    m.peer_lid = lid;  // the QP that vanished, here
    m.peer_qpn = qpn;
    m.pins.clear();
    commit(m);
}

void WorkerLink::answer(const Request& req, const Response& resp, Pins& pins) {
    WorkerMsg& m = answer_slot();
    m.kind = req.qp_type == IBV_QPT_RC ? WorkerMsg::Kind::Response : WorkerMsg::Kind::Sent;
    m.resp = resp;
    m.resp.tm = is_tm_request(req.opcode);  // a drop decided here too
    m.lid = req.slid;
    m.qpn = req.sqpn;
    m.peer_lid = req.dlid;
    m.peer_qpn = req.dqpn;
    m.sq_idx = req.sq_idx;
    m.pins.clear();
    m.pins.take(pins);
    commit(m);
}

void WorkerLink::on_request(WorkerMsg& m) {
    ++stats_.requests_in;
    const Request& req = m.req;
    if (req.inline_payload) {
        m.local[0] = Span{m.payload_room(req.length), req.length};
        m.nlocal = req.length ? 1 : 0;
    }
    if (is_multicast_lid(req.dlid)) {
        // A multicast datagram (multicast_delivery.h): to this worker's
        // members of the group; nobody waits for an answer.
        if (req.fan_out && req.inline_payload && m.first && m.last && req.length <= kPortMtuBytes)
            multicast_deliver(eng_, req, m.payload_room(req.length), DeliverTo::ThisWorker);
        return;
    }
    const bool whole = m.first && m.last;
    Inbound* in = &one_;
    if (!whole) {
        const uint64_t k = key(req.slid, req.sqpn);
        auto it = inbound_.find(k);
        if (m.first) {
            if (it == inbound_.end()) it = inbound_.emplace(k, std::make_unique<Inbound>()).first;
        } else if (it == inbound_.end()) {
            return;  // not after a first slice: the requester never sends that
        }
        in = it->second.get();
    }
    if (m.first) {
        in->req = req;
        in->d.reset();
        in->target.clear();
        in->source.clear();
        in->discard = false;
        if (!whole) in->source.take(m.pins);
        if (!eng_.serves(req.dlid)) {
            // Only this worker's guests are served here: nobody answers.
            in->d.resp.syndrome = Syndrome::Drop;
            in->d.resp.psn = req.psn;
            in->discard = true;
        } else {
            responder_begin(eng_, req, in->d, whole ? nullptr : &in->target);
            if (in->d.resp.syndrome != Syndrome::Ack || in->d.length == 0) {
                responder_finish(in->d);  // the receive completion, if any
                in->discard = true;
            }
        }
    } else if (!in->discard && !responder_still_there(eng_, in->d, req.psn)) {
        in->discard = true;
    }
    if (!in->discard && m.bytes &&
        !timed_move(eng_, in->req, in->d, m.local, m.nlocal, m.offset, m.bytes, stats_.copied_bytes))
        in->discard = true;  // a page was lost under the copy: d.resp says whose
    if (!m.last) return;
    responder_finish(in->d);  // done already when it failed or moved nothing
    if (!in->req.fan_out) answer(in->req, in->d.resp, whole ? m.pins : in->source);
    in->target.clear();
    if (!whole) inbound_.erase(key(req.slid, req.sqpn));
}

void WorkerLink::on_answer(WorkerMsg& m) {
    switch (m.kind) {
    case WorkerMsg::Kind::Request:
        break;
    case WorkerMsg::Kind::Response: {
        QpRef q = eng_.qpns().find(m.lid, m.qpn);
        if (!q || q.qp->type != IBV_QPT_RC || q.qp->attr.ah.dlid != m.peer_lid || q.qp->attr.dest_qp_num != m.peer_qpn)
            break;
        if (m.resp.tm)
            tm_answered(eng_, *q.ctx, *q.qp, m.resp, 0);
        else
            requester_on_response(eng_, *q.ctx, *q.qp, m.resp);
        break;
    }
    case WorkerMsg::Kind::Sent:
        if (QpRef q = eng_.qpns().find(m.lid, m.qpn)) requester_sent(eng_, *q.ctx, *q.qp, m.sq_idx);
        break;
    case WorkerMsg::Kind::Abort: {
        auto it = inbound_.find(key(m.lid, m.qpn));
        if (it == inbound_.end()) break;
        Inbound& in = *it->second;
        if (!in.discard) {
            responder_revalidate(eng_, in.d);
            responder_end(in.d, PayloadEnd::Lost);
        }
        WorkerMsg& r = answer_slot();
        r.kind = WorkerMsg::Kind::Release;
        r.pins.clear();
        r.pins.take(in.source);
        commit(r);
        inbound_.erase(it);
        break;
    }
    case WorkerMsg::Kind::Release:
        break;  // the pins it brought back go with the slot
    case WorkerMsg::Kind::QpGone:
        eng_.fail_peer_qp(m.peer_lid, m.peer_qpn, m.lid, m.qpn, m.event);
        break;
    }
}

uint64_t WorkerLink::receive(WorkerMsg& m) {
    uint64_t moved = 0;
    if (m.kind == WorkerMsg::Kind::Request) {
        on_request(m);
        moved = m.bytes;
    } else {
        on_answer(m);
    }
    m.pins.clear();  // the requester's mappings are let go by their own worker only
    return moved;
}

bool receive_messages(WorkerInbox& inbox, WorkerLink* const* links, uint32_t nlinks, uint64_t budget) {
    bool progress = false;
    uint64_t used = 0;
    while (WorkerMsg* m = inbox.ring.front()) {
        if (m->from < nlinks && links[m->from])
            used += links[m->from]->receive(*m) + TurnScheduler::kWqeCost;
        m->pins.clear();
        inbox.ring.pop();
        progress = true;
        if (used >= budget) break;
    }
    return progress;
}

}  // namespace vrdma::shim
