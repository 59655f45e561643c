#include "payload_move.h"

#include <infiniband/verbs.h>

#include "engine.h"

namespace vrdma::shim {

bool move_payload(const Request& req, Delivery& d, const Span* local, uint32_t nlocal, uint64_t at,
                  uint64_t bytes) {
    const bool read = request_reads(req.opcode);
    CopyFault f = read ? copy_sg(local, nlocal, at, d.spans, d.nspans, at, bytes)
                       : copy_sg(d.spans, d.nspans, d.skip + at, local, nlocal, at, bytes);
    if (f == CopyFault::None) return true;
    const bool local_fault = f == (read ? CopyFault::Dst : CopyFault::Src);
    responder_end(d, local_fault ? PayloadEnd::RequesterFault : PayloadEnd::ResponderFault);
    return false;
}

bool timed_move(Engine& eng, const Request& req, Delivery& d, const Span* local, uint32_t nlocal, uint64_t at,
                uint64_t bytes, uint64_t& copied) {
    const bool timed = bytes >= TurnScheduler::kTimedCopyBytes;
    const uint64_t t0 = timed ? eng.now() : 0;
    const bool moved = move_payload(req, d, local, nlocal, at, bytes);
    eng.turns().charge_copy(bytes, timed ? eng.now() - t0 : 0);
    copied += bytes;
    return moved;
}

}  // namespace vrdma::shim
