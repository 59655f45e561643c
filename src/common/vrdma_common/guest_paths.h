// Where a shim publishes a guest's files under its run directory, and how a
// tool checks that the shim serving a guest is alive.
#pragma once

#include <string>

namespace vrdma {

struct GuestPaths {
    std::string dir;         // RUN_DIR/NAME
    std::string sysfs;       // RUN_DIR/NAME/sys (the guest's SYSFS_PATH)
    std::string socket;      // RUN_DIR/NAME/vrdma.sock
    std::string device_dir;  // RUN_DIR/NAME/sys/class/infiniband/vrdma0
};

GuestPaths guest_paths(const std::string& run_dir, const std::string& guest);

// Guest names the shim accepts: 1-32 of [A-Za-z0-9_.-], not "." or "..".
bool valid_guest_name(const std::string& name);

// Connects to the guest's socket (connect_to_shim: only to a shim this
// process trusts) and hangs up. Returns "" when a shim answered, otherwise
// one line saying what is wrong; `refused` (if given) tells that this user
// may not use the guest (its owner is another), `untrusted` that the socket
// or its directories are not a trusted shim's (nothing was handed over).
std::string probe_guest(const std::string& run_dir, const std::string& guest, bool* refused = nullptr,
                        bool* untrusted = nullptr);

}  // namespace vrdma
