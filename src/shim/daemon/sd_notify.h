// The service manager's readiness protocol (systemd's sd_notify(3), without
// libsystemd): datagrams such as "READY=1" to the Unix socket named by
// $NOTIFY_SOCKET ("@name" for an abstract one). Without the variable
// nothing is sent. The unit file (packaging/systemd/vrdma-shim.service) is
// Type=notify: systemd starts the shim's dependants only once its guests
// are published, and knows when a reload is under way and when it stops.
#pragma once

#include <string>

namespace vrdma::shim {

// Sends `state` (lines such as "READY=1\nSTATUS=...") if the shim runs
// under a service manager; false if that failed (logged by the caller).
bool sd_notify(const std::string& state);

}  // namespace vrdma::shim
