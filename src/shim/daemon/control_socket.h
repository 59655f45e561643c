// The operator's control socket, RUN_DIR/control.sock (SOCK_SEQPACKET, mode
// 0600; only the shim's own user or root may use it, checked with
// SO_PEERCRED). One text request per message, one text reply, then the shim
// closes the connection. vrdmactl is its client.
//
//   port NAME down   port 1 of guest NAME goes DOWN: PORT_ERR to its contexts
//   port NAME up     back to ACTIVE: PORT_ACTIVE
//   weight NAME W    guest NAME's share of its worker from now on (1..16)
//   peers            one line per peer shim of the fabric (fabric.h)
//   counters         what isolation stopped, per guest and per QP
//                    (security_report.h)
//   load             who uses the shim: per worker and per guest
//                    (load_report.h)
//
// Replies: "ok", the text asked for, or "error: REASON".
#pragma once

#include <functional>
#include <string>

#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

constexpr const char* kControlSocketName = "control.sock";

bool open_control_socket(int run_fd, const std::string& path, UniqueFd& out, std::string& error);

// What a request may do, supplied by the daemon.
struct ControlActions {
    // Sets port 1 of `guest` up or down. False with `error` set on failure.
    std::function<bool(const std::string& guest, bool up, std::string& error)> set_port;
    // Sets the weight of `guest` (text, checked: 1..kMaxGuestWeight).
    std::function<bool(const std::string& guest, const std::string& weight, std::string& error)> set_weight;
    // The fabric's peers, one line each.
    std::function<std::string()> peers;
    // The isolation counters, one line per guest and per QP that has any.
    std::function<std::string()> counters;
    // Work per worker and per guest, one line each.
    std::function<std::string()> load;
    // Payload moved and copied per transport, one line each.
    std::function<std::string()> transports;
    // Adds a guest from a --guest spec: its line ("guest NAME lid L worker
    // W"), or "" with `error` set.
    std::function<std::string(const std::string& spec, std::string& error)> add_guest;
    // Removes a guest. False with `error` set on failure.
    std::function<bool(const std::string& guest, std::string& error)> remove_guest;
    // Reads the --config file again: what was applied and refused; `ok`
    // false if anything was refused.
    std::function<std::string(bool& ok)> reload;
};

// Checks the peer, reads one request from the accepted connection `fd`,
// executes it and sends the reply. Never blocks (the socket is nonblocking);
// returns true if the connection is finished (reply sent or peer gone) and
// false if the request has not arrived yet.
bool handle_control_connection(int fd, const ControlActions& actions);

}  // namespace vrdma::shim
