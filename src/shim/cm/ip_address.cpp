#include "ip_address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

namespace vrdma::shim::cm {

bool IpAddress::operator==(const IpAddress& o) const {
    return family == o.family && std::memcmp(bytes, o.bytes, family == AF_INET ? 4 : 16) == 0;
}

bool IpAddress::is_any() const {
    static const uint8_t zero[16] = {};
    return std::memcmp(bytes, zero, family == AF_INET ? 4 : 16) == 0;
}

bool IpAddress::is_loopback() const {
    if (family == AF_INET) return bytes[0] == 127;
    static const uint8_t one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return family == AF_INET6 && std::memcmp(bytes, one, 16) == 0;
}

bool IpAddress::is_multicast() const {
    if (family == AF_INET) return (bytes[0] & 0xf0) == 0xe0;
    return family == AF_INET6 && bytes[0] == 0xff;
}

bool multicast_gid(const IpAddress& group, bool udp_port_space, uint16_t pkey, uint8_t mgid[16]) {
    if (group.is_any() || (group.family != AF_INET && group.family != AF_INET6)) return false;
    const uint8_t* a = group.bytes;
    if (group.family == AF_INET6 && a[0] == 0xff && (a[1] & 0xf0) == 0x10 && a[2] == 0xa0 && a[3] == 0x1b) {
        std::memcpy(mgid, a, 16);
        return true;
    }
    std::memset(mgid, 0, 16);
    mgid[0] = 0xff;
    mgid[1] = 0x12;  // transient, link-local scope
    mgid[2] = group.family == AF_INET ? 0x40 : 0x60;
    mgid[3] = udp_port_space ? 0x01 : 0x1b;
    mgid[4] = uint8_t(pkey >> 8);
    mgid[5] = uint8_t(pkey);
    if (group.family == AF_INET) {
        mgid[12] = a[0] & 0x0f;
        std::memcpy(mgid + 13, a + 1, 3);
    } else {
        std::memcpy(mgid + 6, a + 6, 10);
    }
    return true;
}

std::string IpAddress::str() const {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (family == AF_INET || family == AF_INET6) ::inet_ntop(family, bytes, buf, sizeof(buf));
    return buf;
}

bool parse_ip(const std::string& text, IpAddress& out) {
    std::string t = text;
    if (t.size() > 2 && t.front() == '[' && t.back() == ']') t = t.substr(1, t.size() - 2);
    IpAddress a;
    if (::inet_pton(AF_INET, t.c_str(), a.bytes) == 1) {
        a.family = AF_INET;
    } else if (::inet_pton(AF_INET6, t.c_str(), a.bytes) == 1) {
        a.family = AF_INET6;
    } else {
        return false;
    }
    out = a;
    return true;
}

bool parse_ip_list(const std::string& text, std::vector<IpAddress>& out, std::string& error) {
    std::vector<IpAddress> list;
    for (size_t start = 0; start <= text.size();) {
        size_t end = text.find(',', start);
        if (end == std::string::npos) end = text.size();
        const std::string one = text.substr(start, end - start);
        IpAddress a;
        if (!parse_ip(one, a)) {
            error = "'" + one + "' is not an IPv4 or IPv6 address";
            return false;
        }
        if (a.is_any() || a.is_loopback()) {
            error = one + " is the wildcard or loopback, which every guest has already";
            return false;
        }
        if (std::find(list.begin(), list.end(), a) != list.end()) {
            error = one + " given twice";
            return false;
        }
        list.push_back(a);
        start = end + 1;
    }
    if (list.empty() || list.size() > 16) {
        error = "1 to 16 addresses, separated by commas";
        return false;
    }
    out = std::move(list);
    return true;
}

bool endpoint_from_sockaddr(const void* raw, size_t len, Endpoint& out) {
    sa_family_t family;
    if (len < sizeof(family)) return false;
    std::memcpy(&family, raw, sizeof(family));
    Endpoint e;
    if (family == AF_INET && len >= sizeof(sockaddr_in)) {
        sockaddr_in sin;
        std::memcpy(&sin, raw, sizeof(sin));
        e.ip.family = AF_INET;
        std::memcpy(e.ip.bytes, &sin.sin_addr, 4);
        e.port = ntohs(sin.sin_port);
    } else if (family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
        sockaddr_in6 sin6;
        std::memcpy(&sin6, raw, sizeof(sin6));
        e.ip.family = AF_INET6;
        std::memcpy(e.ip.bytes, &sin6.sin6_addr, 16);
        e.port = ntohs(sin6.sin6_port);
        e.scope_id = sin6.sin6_scope_id;
    } else {
        return false;
    }
    out = e;
    return true;
}

void endpoint_to_sockaddr(const Endpoint& e, void* raw, size_t len) {
    std::memset(raw, 0, len);
    if (e.ip.family == AF_INET && len >= sizeof(sockaddr_in)) {
        sockaddr_in sin{};
        sin.sin_family = AF_INET;
        sin.sin_port = htons(e.port);
        std::memcpy(&sin.sin_addr, e.ip.bytes, 4);
        std::memcpy(raw, &sin, sizeof(sin));
    } else if (e.ip.family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
        sockaddr_in6 sin6{};
        sin6.sin6_family = AF_INET6;
        sin6.sin6_port = htons(e.port);
        sin6.sin6_scope_id = e.scope_id;
        std::memcpy(&sin6.sin6_addr, e.ip.bytes, 16);
        std::memcpy(raw, &sin6, sizeof(sin6));
    }
}

}  // namespace vrdma::shim::cm
