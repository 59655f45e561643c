#include "qkey_guard.h"

#include "vrdma_common/log.h"

namespace vrdma::shim::qkey_guard_detail {

// From a (source, target) pair that keeps guessing: dropped, counted.
bool note_throttled(Engine& eng, Context& ctx, const Request& req) {
    GuestSecurity& s = eng.guests().security_of(ctx.guest());
    ++s.throttled_datagrams;
    unsigned long long more = 0;
    if (!s.datagram_throttle_log.due(eng.now(), more)) return false;
    LOG_WARN("guest %s: UD datagram from lid %u QPN %u dropped unexamined: that source sent it over %u datagrams "
             "a second with a wrong qkey (guessing qkeys?) (%llu more since the last warning)",
             ctx.guest().name.c_str(), req.slid, req.sqpn, eng.qkey_throttle().limit(),
             more);
    return false;
}

// A wrong qkey: dropped, counted, charged. The throttle's own verdict is not
// logged apart: a guesser that keeps at the limit would be throttled anew
// at each token, and note_throttled says the rest.
bool note_violation(Engine& eng, Context& ctx, Qp& qp, const Request& req) {
    GuestSecurity& s = eng.guests().security_of(ctx.guest());
    ++s.qkey_violations;
    eng.qkey_throttle().charge(GuessThrottle::pair(req.slid, ctx.guest().lid), eng.now());
    unsigned long long more = 0;
    if (!s.qkey_log.due(eng.now(), more)) return false;
    LOG_WARN("guest %s: QP %u: UD datagram from lid %u QPN %u with a wrong qkey (0x%08x) dropped "
             "(%llu more since the last warning)",
             ctx.guest().name.c_str(), qp.qpn, req.slid, req.sqpn, req.qkey,
             more);
    return false;
}

}  // namespace vrdma::shim::qkey_guard_detail
