#include "vrdma_common/guest_paths.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "vrdma_common/unique_fd.h"

namespace vrdma {

GuestPaths guest_paths(const std::string& run_dir, const std::string& guest) {
    GuestPaths p;
    p.dir = run_dir + "/" + guest;
    p.sysfs = p.dir + "/sys";
    p.socket = p.dir + "/vrdma.sock";
    p.device_dir = p.sysfs + "/class/infiniband/vrdma0";
    return p;
}

bool valid_guest_name(const std::string& name) {
    if (name.empty() || name.size() > 32 || name == "." || name == "..") return false;
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        if (!ok) return false;
    }
    return true;
}

std::string probe_guest(const std::string& run_dir, const std::string& guest, bool* refused) {
    if (refused) *refused = false;
    GuestPaths p = guest_paths(run_dir, guest);
    struct stat st;
    if (::stat(run_dir.c_str(), &st) != 0)
        return "run directory " + run_dir + " does not exist: is vrdma-shim running (vrdma-shim --run-dir " +
               run_dir + " --guest " + guest + ")?";
    if (::stat(p.dir.c_str(), &st) != 0)
        return "no guest '" + guest + "' in " + run_dir + ": the shim there does not serve it";
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (p.socket.size() >= sizeof(addr.sun_path)) return "socket path too long: " + p.socket;
    std::memcpy(addr.sun_path, p.socket.c_str(), p.socket.size() + 1);
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!fd) return std::string("socket: ") + std::strerror(errno);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return "";
    if (errno == EACCES || errno == EPERM) {
        // The guest's directory and socket belong to its owner (vrdma-shim
        // --guest NAME:owner=...): this user is not allowed in.
        if (refused) *refused = true;
        char mode[8];
        std::snprintf(mode, sizeof(mode), "%04o", unsigned(st.st_mode & 07777));
        return "access to guest '" + guest + "' refused: " + p.dir + " belongs to uid " + std::to_string(st.st_uid) +
               " gid " + std::to_string(st.st_gid) + " (mode " + mode + ") and this process runs as uid " +
               std::to_string(::geteuid()) + "; the shim's operator grants a guest with --guest " + guest +
               ":owner=USER or :group=GROUP";
    }
    return "the shim for guest '" + guest + "' is not answering on " + p.socket + " (" + std::strerror(errno) +
           "): is vrdma-shim running?";
}

}  // namespace vrdma
