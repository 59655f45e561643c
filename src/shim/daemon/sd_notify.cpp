#include "sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

bool sd_notify(const std::string& state) {
    const char* path = std::getenv("NOTIFY_SOCKET");
    if (!path || !*path) return true;
    const size_t len = std::strlen(path);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof(addr.sun_path)) return false;
    std::memcpy(addr.sun_path, path, len);
    if (path[0] == '@') addr.sun_path[0] = 0;  // abstract namespace
    UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd) return false;
    const socklen_t alen = socklen_t(offsetof(sockaddr_un, sun_path) + len);
    return ::sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), alen) ==
           ssize_t(state.size());
}

}  // namespace vrdma::shim
