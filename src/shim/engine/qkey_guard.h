// The qkey check of a UD datagram at its target QP (docs/reliability.md
// "What a tenant can do to another"). A datagram with a wrong qkey is
// dropped, as on InfiniBand, and also counted (qkey_violations of the target
// guest in vrdmactl counters), logged at most once a second per guest and
// charged to the pair (source LID, target LID) in the qkey throttle
// (guess_throttle.h). Once a pair is throttled, every datagram of that
// source to that guest is dropped unexamined, the right qkey or not, so a
// guesser gets `limit` tries a second whatever it sends: 2^32 qkeys take
// years, not minutes.
//
// Honest traffic pays one relaxed load and the comparison it always had.
#pragma once

#include "context.h"
#include "engine.h"
#include "request.h"
#include "resources.h"

namespace vrdma::shim {

namespace qkey_guard_detail {
bool note_throttled(Engine& eng, Context& ctx, const Request& req);
bool note_violation(Engine& eng, Context& ctx, Qp& qp, const Request& req);
}  // namespace qkey_guard_detail

// Whether `qp` of `ctx` takes datagram `req` as far as its qkey goes.
inline bool qkey_admits(Engine& eng, const Request& req, Context& ctx, Qp& qp) {
    GuessThrottle& throttle = eng.qkey_throttle();
    if (throttle.anyone_throttled() &&
        throttle.throttled(GuessThrottle::pair(req.slid, ctx.guest().lid), eng.now()))
        return qkey_guard_detail::note_throttled(eng, ctx, req);
    if (qp.attr.qkey == req.qkey) return true;
    // A multicast copy to a member with another Q_Key (legal: that member
    // drops it) is no guess of the sender's: dropped, not charged.
    if (req.fan_out) return false;
    return qkey_guard_detail::note_violation(eng, ctx, qp, req);
}

}  // namespace vrdma::shim
