#include "vrdma_common/ipv4_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstdlib>

namespace vrdma {

bool parse_endpoint(const std::string& text, sockaddr_in& out, std::string& error) {
    auto colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
        error = "'" + text + "' is not ADDR:PORT";
        return false;
    }
    std::string host = text.substr(0, colon), port = text.substr(colon + 1);
    char* end;
    unsigned long p = std::strtoul(port.c_str(), &end, 10);
    if (*end || p == 0 || p > 65535) {
        error = "'" + port + "' is not a TCP port (in '" + text + "')";
        return false;
    }
    out = sockaddr_in{};
    out.sin_family = AF_INET;
    out.sin_port = htons(uint16_t(p));
    if (::inet_pton(AF_INET, host.c_str(), &out.sin_addr) == 1) return true;
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) {
        error = "cannot resolve '" + host + "' (in '" + text + "')";
        return false;
    }
    out.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    ::freeaddrinfo(res);
    return true;
}

}  // namespace vrdma
