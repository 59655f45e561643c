// Moving a request's payload between the requester's memory and the
// responder's delivery (responder.h), by memcpy in this process: the local
// transport and the worker link (worker_link.h) both do it.
#pragma once

#include <cstdint>

#include "request.h"
#include "responder.h"
#include "work_queue.h"

namespace vrdma::shim {

class Engine;

// Moves `bytes` of the payload from offset `at`: from `local` to the
// delivery's spans (SEND, WRITE) or from them to `local` (READ). A page the
// guest took away under the copy (fault_guard.h) fails the side it belonged
// to: the requester's memory gives it IBV_WC_LOC_PROT_ERR (the receive, if
// one was taken, never gets its payload), the responder's an access NAK.
// Returns false then, with d.resp saying so.
bool move_payload(const Request& req, Delivery& d, const Span* local, uint32_t nlocal, uint64_t at,
                  uint64_t bytes);

// move_payload, charged to the engine's turn (engine.h: by its time when
// large) and counted as bytes the CPU copied (`copied`).
bool timed_move(Engine& eng, const Request& req, Delivery& d, const Span* local, uint32_t nlocal, uint64_t at,
                uint64_t bytes, uint64_t& copied);

}  // namespace vrdma::shim
