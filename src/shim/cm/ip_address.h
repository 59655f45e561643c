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
    bool is_multicast() const; // 224.0.0.0/4 or ff00::/8
    std::string str() const;
};

// An address and port, as a UCMA command carries it.
struct Endpoint {
    IpAddress ip;
    uint16_t port = 0;  // host order
    uint32_t scope_id = 0;
};

// The MGID an IP multicast group maps to in partition `pkey`, as IPoIB maps
// it (RFC 4391) with link-local scope, and as the kernel's rdma_cm does:
// in the UDP port space its signature is 0x4001 (IPv4) or 0x6001 (IPv6)
// instead of IPoIB's 0x401b and 0x601b. An IPv6 address that is an
// SA-assigned MGID (ff1x:a01b::/32) is the MGID itself. False for the
// wildcard (the caller assigns a group of its own).
bool multicast_gid(const IpAddress& group, bool udp_port_space, uint16_t pkey, uint8_t mgid[16]);

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
