// The transports this shim knows, besides its own local transport and the
// links between its workers (which every shim has): each one's factory
// (transport_plugin.h), named once in transport_registry.cpp. The options
// parser, the configuration file and --help learn their options here; the
// daemon makes the plugins the options ask for.
#pragma once

#include <string>
#include <vector>

#include "transport_plugin.h"

namespace vrdma::shim {

const std::vector<const TransportFactory*>& transport_factories();

// The transport option called `name` ("--fabric-peer"), or null.
const TransportOption* find_transport_option(const std::string& name);

}  // namespace vrdma::shim
