// IP addresses of guests for the connection manager (rdma_cm): what an
// operator gives with --guest NAME:ip=ADDR[,ADDR...], and the sockaddrs
// that librdmacm passes in UCMA commands.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vrdma::shim::cm {

struct IpAddress {
    sa_family_t family = AF_UNSPEC;  // AF_INET or AF_INET6
    uint8_t bytes[16] = {};          // network order; AF_INET uses the first 4

    bool operator==(const IpAddress& o) const;
    bool is_any() const;       // 0.0.0.0 or ::
    bool is_loopback() const;  // 127.0.0.0/8 or ::1
    std::string str() const;
};

// An address and port, as a UCMA command carries it.
struct Endpoint {
    IpAddress ip;
    uint16_t port = 0;  // host order
    uint32_t scope_id = 0;
};

// "10.0.0.1", "fd00::2" or "[fd00::2]".
bool parse_ip(const std::string& text, IpAddress& out);
// "ADDR[,ADDR...]" (1 to 16 addresses, none twice). False with `error` set.
bool parse_ip_list(const std::string& text, std::vector<IpAddress>& out, std::string& error);

// A sockaddr from a command: AF_INET or AF_INET6 in `len` bytes of `raw`
// (the kernel's sockaddr_storage or sockaddr_in6 fields). False: another
// family or too short.
bool endpoint_from_sockaddr(const void* raw, size_t len, Endpoint& out);
// Writes `e` as a sockaddr_in or sockaddr_in6 into `len` bytes at `raw`
// (zeroed first).
void endpoint_to_sockaddr(const Endpoint& e, void* raw, size_t len);

}  // namespace vrdma::shim::cm
