// A large transfer that a transport moves one slice per turn (engine.h,
// "Work per turn"), so that no transfer holds a worker for much longer than
// a turn: the local transport copies a slice per turn, the worker link
// (worker_link.h) hands one to the other worker. The requester offers the
// same WQE again on every pass until the last slice; the request it builds
// from it must not change meanwhile (a guest that rewrites its WQE abandons
// the transfer).
#pragma once

#include <cstdint>

#include "request.h"
#include "responder.h"
#include "work_queue.h"

namespace vrdma::shim {

class Engine;
class Transport;
struct Qp;

struct SlicedCopy {
    Transport* owner = nullptr;  // the transport moving it (abandon_transfer)
    bool active = false;
    Request req;
    Delivery d;     // the local transport: the responder's decision
    Pins target;    // the local transport: the responder's memory, pinned
    uint64_t done = 0;  // bytes moved (or handed over) so far
};

// Whether `req` moves in slices: a payload or READ larger than a slice, on
// a connected QP (a datagram is never larger than the MTU).
bool sliceable(const Request& req);
// Whether `b` is the request `a` was built from (the same WQE, sent again).
bool same_request(const Request& a, const Request& b);
// The QP's transfer in slices, if one is under way, stops (the QP is reset,
// in error or destroyed, or its WQE changed): its owner makes the receive
// it took fail (IBV_WC_REM_ABORT_ERR), as when a peer shim goes away
// mid-message.
void abandon_transfer(Engine& eng, Qp& qp);
// Every transfer `owner` moves stops without a word to it: the owner is
// going away (its destructor calls this), and an engine torn down later
// must not call it back.
void forget_transfers(Engine& eng, const Transport* owner);
// The QP's transfer state, made at its first large transfer (kept between
// transfers: no allocation per message).
SlicedCopy& sliced_state(Qp& qp);

}  // namespace vrdma::shim
