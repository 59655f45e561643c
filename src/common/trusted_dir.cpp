#include "vrdma_common/trusted_dir.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace vrdma {
namespace {

std::string mode_text(mode_t m) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "%04o", unsigned(m & 07777));
    return buf;
}

// Why nobody but root and `trusted` may have changed directory `where`, or
// "" when that holds.
std::string untrusted_because(const std::string& where, const struct stat& st, uid_t trusted, bool sticky_ok) {
    if (st.st_uid != 0 && st.st_uid != trusted)
        return where + " belongs to " + describe_uid(st.st_uid) + ", not to root" +
               (trusted != 0 ? " or " + describe_uid(trusted) : std::string()) + ": that user can replace what is in it";
    const bool writable_by_others = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if (writable_by_others && !(sticky_ok && (st.st_mode & S_ISVTX)))
        return where + " has mode " + mode_text(st.st_mode) + (sticky_ok ? " (group or others may write, no sticky bit)"
                                                                          : " (group or others may write)") +
               ": other users can replace what is in it";
    return "";
}

}  // namespace

std::string describe_uid(uid_t uid) {
    std::string name = "?";
    std::vector<char> buf(4096);
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found) name = found->pw_name;
    return "uid " + std::to_string(uid) + " (" + name + ")";
}

UniqueFd open_trusted_dir(const std::string& real, uid_t trusted, int strict_tail, std::string& error) {
    if (real.empty() || real[0] != '/') {
        error = "not an absolute path: " + real;
        return {};
    }
    std::vector<std::string> parts;
    for (size_t pos = 1; pos < real.size();) {
        size_t slash = real.find('/', pos);
        if (slash == std::string::npos) slash = real.size();
        if (slash > pos) parts.push_back(real.substr(pos, slash - pos));
        pos = slash + 1;
    }
    UniqueFd cur(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    std::string where = "/";
    const size_t n = parts.size();
    for (size_t i = 0; i <= n; ++i) {
        if (i > 0) {
            where = (where == "/" ? "" : where) + "/" + parts[i - 1];
            cur.reset(::openat(cur.get(), parts[i - 1].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        }
        struct stat st;
        if (!cur || ::fstat(cur.get(), &st) != 0) {
            error = "cannot open " + where + ": " +
                    (errno == ELOOP || errno == ENOTDIR ? "not a directory (a link is never followed)"
                                                        : std::strerror(errno));
            return {};
        }
        const bool in_tail = n - i < size_t(strict_tail);
        if (std::string why = untrusted_because(where, st, trusted, !in_tail); !why.empty()) {
            error = why;
            return {};
        }
    }
    return cur;
}

bool acceptable_shim_user(uid_t uid) {
    if (uid == 0 || uid == ::geteuid()) return true;
    const char* v = std::getenv("VRDMA_SHIM_UID");
    if (!v || !*v) return false;
    char* end = nullptr;
    errno = 0;
    unsigned long n = std::strtoul(v, &end, 10);
    return errno == 0 && end && !*end && n == uid;
}

ShimConnect connect_to_shim(const std::string& path, UniqueFd& out, std::string& error, int* connect_errno,
                            int levels) {
    if (connect_errno) *connect_errno = 0;
    const size_t slash = path.rfind('/');
    if (path.empty() || path[0] != '/' || slash == std::string::npos || slash + 1 == path.size()) {
        error = "not an absolute socket path: " + path;
        return ShimConnect::Untrusted;
    }
    const std::string dir = slash == 0 ? "/" : path.substr(0, slash);
    char real[PATH_MAX];
    if (!::realpath(dir.c_str(), real)) {
        error = "cannot resolve " + dir + ": " + std::strerror(errno);
        if (connect_errno) *connect_errno = errno;
        return ShimConnect::ConnectFailed;
    }
    // Who made the socket's directory is who the shim is; it must be a user
    // this process accepts as a shim before anything else is believed.
    UniqueFd probe(::open(real, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (!probe || ::fstat(probe.get(), &st) != 0) {
        error = std::string("cannot open ") + real + ": " + std::strerror(errno);
        return ShimConnect::Untrusted;
    }
    const uid_t shim_uid = st.st_uid;
    if (!acceptable_shim_user(shim_uid)) {
        error = std::string(real) + " belongs to " + describe_uid(shim_uid) +
                ", which is neither root nor this user: not a shim this process trusts (a shim run by another "
                "user is accepted with VRDMA_SHIM_UID=UID, vrdma-run --shim-user USER)";
        return ShimConnect::Untrusted;
    }
    // The shim's own directories: no sticky excuse.
    UniqueFd dirfd = open_trusted_dir(real, shim_uid, levels, error);
    if (!dirfd) return ShimConnect::Untrusted;
    const std::string name = path.substr(slash + 1);
    struct stat sst;
    if (::fstatat(dirfd.get(), name.c_str(), &sst, AT_SYMLINK_NOFOLLOW) != 0) {
        if (connect_errno) *connect_errno = errno;
        error = "cannot reach " + path + ": " + std::strerror(errno);
        return ShimConnect::ConnectFailed;
    }
    if (!S_ISSOCK(sst.st_mode)) {
        error = path + " is not a socket";
        return ShimConnect::Untrusted;
    }
    // Connect through the checked directory (its fd), not by re-resolving
    // the path: /proc/self/fd/N/NAME names the entry in that very directory.
    const std::string via = "/proc/self/fd/" + std::to_string(dirfd.get()) + "/" + name;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string& target = via.size() < sizeof(addr.sun_path) ? via : path;
    if (target.size() >= sizeof(addr.sun_path)) {
        error = "socket path too long: " + path;
        return ShimConnect::Untrusted;
    }
    std::memcpy(addr.sun_path, target.c_str(), target.size() + 1);
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!fd) {
        if (connect_errno) *connect_errno = errno;
        error = std::string("socket: ") + std::strerror(errno);
        return ShimConnect::ConnectFailed;
    }
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    if (rc != 0 && errno == ENOENT && &target != &path && path.size() < sizeof(addr.sun_path)) {
        // No /proc (a bare container): the path, whose directories were checked.
        std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
        rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    }
    if (rc != 0) {
        if (connect_errno) *connect_errno = errno;
        error = "cannot connect to " + path + ": " + std::strerror(errno);
        return ShimConnect::ConnectFailed;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        error = std::string("cannot read the credentials of the process on ") + path + ": " + std::strerror(errno);
        return ShimConnect::Untrusted;
    }
    if (cred.uid != shim_uid) {
        error = "the process listening on " + path + " (pid " + std::to_string(cred.pid) + ") runs as " +
                describe_uid(cred.uid) + ", not as the shim's user " + describe_uid(shim_uid) +
                " who owns its directory: nothing handed over";
        return ShimConnect::Untrusted;
    }
    out = std::move(fd);
    return ShimConnect::Ok;
}

}  // namespace vrdma
