// The text of `vrdmactl counters`: what isolation stopped, one line per
// guest, then one per QP with a nonzero counter:
//   guest a remote_access_errors 3 stranger_requests 12 pkey_violations 0 refused_connections 300 throttled_requests 0
//     qkey_violations 64 throttled_datagrams 90000   (on the same line)
//   qp a 0x3f2a11 remote_access_errors 3 stranger_requests 12
#pragma once

#include <string>

#include "engine.h"

namespace vrdma::shim {

// Appends the guest lines of `eng`'s guests to `guests` and the QP lines
// to `qps` (the shim prints every worker's guest lines first).
void security_report(Engine& eng, std::string& guests, std::string& qps);

}  // namespace vrdma::shim
