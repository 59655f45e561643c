#include "listen_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vrdma::shim {
namespace {

bool set_path(sockaddr_un& addr, const std::string& path) {
    if (path.size() >= sizeof(addr.sun_path)) return false;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return true;
}

}  // namespace

bool bind_socket_at(int dir_fd, const std::string& shown, const std::string& name, mode_t mask, int backlog,
                    UniqueFd& out, std::string& error, int type) {
    UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
        error = std::string("socket: ") + std::strerror(errno);
        return false;
    }
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
        error = "cannot remove the stale " + shown + ": " + std::strerror(errno);
        return false;
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string via = "/proc/self/fd/" + std::to_string(dir_fd) + "/" + name;
    const bool have_proc = ::access("/proc/self/fd", X_OK) == 0;
    if (!set_path(addr, have_proc ? via : shown)) {
        error = "socket path too long: " + shown;
        return false;
    }
    const mode_t old_mask = ::umask(mask);
    const bool bound = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::umask(old_mask);
    if (!bound || ::listen(fd.get(), backlog) != 0) {
        error = "cannot listen on " + shown + ": " + std::strerror(errno);
        return false;
    }
    out = std::move(fd);
    return true;
}

}  // namespace vrdma::shim
