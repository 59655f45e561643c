// Who may use a guest: its owner (a user), optionally a group, and root.
// Given on the command line as --guest NAME[:owner=USER|UID][:group=GROUP|GID];
// the default owner is the user the shim runs as, with no group. The
// guest's directory and socket belong to the owner (mode 0700/0600, or
// 0750/0660 with the group), and every connection's SO_PEERCRED is checked
// at accept, before it is charged to the guest.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <string>

namespace vrdma::shim {

struct GuestAccess {
    uid_t owner = ::geteuid();
    bool has_group = false;
    gid_t group = 0;

    // "owner=alice:group=rdma" (the part after NAME:), names or numbers.
    // Empty: the shim's own effective user. False with `error` set.
    bool parse(const std::string& spec, std::string& error);
    // May a process with these credentials use the guest? Root, the owner,
    // and (with a group) members of the group, by primary or supplementary
    // group of the user.
    bool allows(uid_t uid, gid_t gid) const;
    // "uid 1000 (alice)" or "uid 1000 (alice), group 27 (rdma)".
    std::string describe() const;
    // Gives the guest's socket `name` in the directory `dir_fd` (`shown`:
    // its path, for errors) to the owner and group: mode 0600, or 0660 with
    // the group. The directory is the shim's, so the entry cannot be swapped.
    bool apply_socket(int dir_fd, const std::string& name, const std::string& shown, std::string& error) const;
};

}  // namespace vrdma::shim
