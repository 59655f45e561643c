// The fabric as a plugin of the daemon (transport_plugin.h): its options
// (--fabric-*), one Fabric per worker, the rdma_cm messages it carries to
// peer shims, and its reports (vrdmactl peers and transports, metrics).
#pragma once

#include "transport_plugin.h"

namespace vrdma::shim::fabric {

const TransportFactory& factory();

}  // namespace vrdma::shim::fabric
