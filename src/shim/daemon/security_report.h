// The text of `vrdmactl counters`: what isolation stopped, one line per
// guest, then one per QP with a nonzero counter:
//   guest a remote_access_errors 3 stranger_requests 12 pkey_violations 0 refused_connections 300 throttled_requests 0
//   qp a 0x3f2a11 remote_access_errors 3 stranger_requests 12
#pragma once

#include <string>

#include "engine.h"

namespace vrdma::shim {

std::string security_report(Engine& eng);

}  // namespace vrdma::shim
