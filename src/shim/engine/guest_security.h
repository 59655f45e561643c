// What one guest suffered or attempted that isolation stopped, for the
// operator (vrdmactl counters) and a rate-limited log: requests with a bad
// rkey, range or access that reached its QPs, requests from QPs its QPs are
// not connected to (strangers), datagrams with a wrong qkey, connections of
// users who do not own it.
#pragma once

#include <cstdint>
#include <string>

namespace vrdma::shim {

struct GuestSecurity {
    uint64_t remote_access_errors = 0;  // NAK-access answered by its QPs
    uint64_t stranger_requests = 0;     // dropped: not from the connected QP incarnation
    uint64_t refused_connections = 0;   // SO_PEERCRED: not the owner
    uint64_t pkey_violations = 0;       // dropped: sender in no partition of the target QP's
    uint64_t throttled_requests = 0;    // dropped: RDMA from a source that keeps guessing keys
    uint64_t qkey_violations = 0;       // dropped: UD datagrams to its QPs with a wrong qkey
    uint64_t throttled_datagrams = 0;   // dropped unexamined: from a source that keeps guessing its qkeys
    // Rate limit of the warnings: at most one a second per guest and kind,
    // saying how many were not logged.
    struct Limiter {
        uint64_t last_ns = 0;
        uint64_t unlogged = 0;
        // Counts one event. True when a warning is due now (at most one a
        // second); `more` is then how many earlier events it covers besides
        // this one, the ones not logged since the last warning.
        bool due(uint64_t now_ns, unsigned long long& more);
    };
    Limiter access_log, stranger_log, refusal_log, pkey_log, throttle_log, qkey_log, datagram_throttle_log;
};

}  // namespace vrdma::shim
