// The RDMA device as a plugin of the daemon (transport_plugin.h): its
// options (--hca, --hca-local), the device opened once per worker (each
// worker's guests' device objects, CQs and events are its own), and its
// line of vrdmactl transports.
#pragma once

#include "transport_plugin.h"

namespace vrdma::shim {

const TransportFactory& hca_factory();

}  // namespace vrdma::shim
