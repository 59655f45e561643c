// An IPv4 endpoint as the operator writes it: the fabric's --fabric-listen
// and --fabric-peer, and the shim's --metrics-listen.
#pragma once

#include <netinet/in.h>

#include <string>

namespace vrdma {

// "a.b.c.d:port" (or "host:port", resolved once) into an IPv4 address.
bool parse_endpoint(const std::string& text, sockaddr_in& out, std::string& error);

}  // namespace vrdma
