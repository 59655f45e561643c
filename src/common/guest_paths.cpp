#include "vrdma_common/guest_paths.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "vrdma_common/trusted_dir.h"
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

std::string probe_guest(const std::string& run_dir, const std::string& guest, bool* refused, bool* untrusted) {
    if (refused) *refused = false;
    if (untrusted) *untrusted = false;
    GuestPaths p = guest_paths(run_dir, guest);
    struct stat st;
    if (::stat(run_dir.c_str(), &st) != 0)
        return "run directory " + run_dir + " does not exist: is vrdma-shim running (vrdma-shim --run-dir " +
               run_dir + " --guest " + guest + ")?";
    if (::stat(p.dir.c_str(), &st) != 0)
        return "no guest '" + guest + "' in " + run_dir + ": the shim there does not serve it";
    UniqueFd fd;
    std::string why;
    int err = 0;
    switch (connect_to_shim(p.socket, fd, why, &err)) {
    case ShimConnect::Ok:
        return "";
    case ShimConnect::Untrusted:
        if (untrusted) *untrusted = true;
        return "not attaching to guest '" + guest + "': " + why;
    case ShimConnect::ConnectFailed:
        break;
    }
    if (err == EACCES || err == EPERM) {
        // The guest's socket belongs to its owner (vrdma-shim --guest
        // NAME:owner=...): this user is not allowed in.
        if (refused) *refused = true;
        struct stat sst {};
        ::stat(p.socket.c_str(), &sst);
        char mode[8];
        std::snprintf(mode, sizeof(mode), "%04o", unsigned(sst.st_mode & 07777));
        return "access to guest '" + guest + "' refused: its socket " + p.socket + " belongs to " +
               describe_uid(sst.st_uid) + " gid " + std::to_string(sst.st_gid) + " (mode " + mode +
               ") and this process runs as uid " + std::to_string(::geteuid()) +
               "; the shim's operator grants a guest with --guest " + guest + ":owner=USER or :group=GROUP";
    }
    return "the shim for guest '" + guest + "' is not answering on " + p.socket + " (" + why +
           "): is vrdma-shim running?";
}

}  // namespace vrdma
