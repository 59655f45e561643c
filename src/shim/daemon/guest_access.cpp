#include "guest_access.h"

#include <grp.h>
#include <pwd.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace vrdma::shim {
namespace {

bool parse_id(const std::string& s, unsigned long& out) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
    errno = 0;
    out = std::strtoul(s.c_str(), nullptr, 10);
    return errno == 0 && out < 0xffffffffUL;
}

std::string user_name(uid_t uid) {
    passwd* p = ::getpwuid(uid);
    return p ? p->pw_name : "?";
}

std::string group_name(gid_t gid) {
    group* g = ::getgrgid(gid);
    return g ? g->gr_name : "?";
}

}  // namespace

bool GuestAccess::parse(const std::string& spec, std::string& error) {
    owner = ::geteuid();
    has_group = false;
    size_t start = 0;
    while (start < spec.size()) {
        size_t colon = spec.find(':', start);
        std::string part = spec.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
        start = colon == std::string::npos ? spec.size() : colon + 1;
        auto eq = part.find('=');
        std::string key = part.substr(0, eq), val = eq == std::string::npos ? "" : part.substr(eq + 1);
        unsigned long id;
        if (key == "owner" && !val.empty()) {
            if (parse_id(val, id)) {
                owner = uid_t(id);
            } else if (passwd* p = ::getpwnam(val.c_str())) {
                owner = p->pw_uid;
            } else {
                error = "no user '" + val + "'";
                return false;
            }
        } else if (key == "group" && !val.empty()) {
            if (parse_id(val, id)) {
                group = gid_t(id);
            } else if (struct group* g = ::getgrnam(val.c_str())) {
                group = g->gr_gid;
            } else {
                error = "no group '" + val + "'";
                return false;
            }
            has_group = true;
        } else {
            error = "'" + part + "' is not owner=USER|UID or group=GROUP|GID";
            return false;
        }
    }
    return true;
}

bool GuestAccess::allows(uid_t uid, gid_t gid) const {
    if (uid == 0 || uid == owner) return true;
    if (!has_group) return false;
    if (gid == group) return true;
    // Supplementary groups of the user (the kernel checked the socket's
    // mode with the process's own; SO_PEERCRED carries only the primary).
    passwd* p = ::getpwuid(uid);
    if (!p) return false;
    int n = 64;
    std::vector<gid_t> groups(static_cast<size_t>(n));
    if (::getgrouplist(p->pw_name, p->pw_gid, groups.data(), &n) < 0) {
        groups.resize(size_t(n));
        if (::getgrouplist(p->pw_name, p->pw_gid, groups.data(), &n) < 0) return false;
    }
    for (int i = 0; i < n; ++i)
        if (groups[size_t(i)] == group) return true;
    return false;
}

std::string GuestAccess::describe() const {
    std::string s = "uid " + std::to_string(owner) + " (" + user_name(owner) + ")";
    if (has_group) s += ", group " + std::to_string(group) + " (" + group_name(group) + ")";
    return s;
}

bool GuestAccess::apply_socket(int dir_fd, const std::string& name, const std::string& shown,
                               std::string& error) const {
    const mode_t mode = has_group ? 0660 : 0600;
    // Owner first, mode second: the socket was bound 0600 for the shim's
    // user, so nobody else can connect before both are set.
    if (::fchownat(dir_fd, name.c_str(), owner, has_group ? group : gid_t(-1), AT_SYMLINK_NOFOLLOW) != 0 ||
        ::fchmodat(dir_fd, name.c_str(), mode, 0) != 0) {
        error = "cannot give " + shown + " to " + describe() + ": " + std::strerror(errno) +
                (::geteuid() != 0 ? " (only root can give files to another user)" : "");
        return false;
    }
    return true;
}

}  // namespace vrdma::shim
