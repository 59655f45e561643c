// The guest socket: listening, and the messages of one connection (Attach,
// AddSegment, RemoveSegment; docs/protocol.md, Attach).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "device_model.h"
#include "engine.h"
#include "guest_access.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

// Creates the guest's listening SOCK_SEQPACKET socket vrdma.sock in the
// guest's directory `dir_fd` (`path` names it in errors), owned and moded as
// `access` says: the one file of the tree the guest's owner is given.
bool open_guest_socket(int dir_fd, const std::string& path, const GuestAccess& access, UniqueFd& out,
                       std::string& error, int type = SOCK_SEQPACKET);

struct Connection {
    uint64_t id = 0;
    const GuestIdentity* guest = nullptr;
    UniqueFd sock;
    uint64_t ctx_id = 0;  // 0 until attached
    uint64_t accepted_ns = 0;  // monotonic; unattached past --attach-timeout: closed
    pid_t pid = -1;
    uid_t uid = 0;
    gid_t gid = 0;
    Charges charges;  // Res::Connections of the guest, given back when closed
};

// Reads the peer's credentials (SO_PEERCRED) into the connection.
void read_peer_credentials(Connection& c);

// Refuses a connection whose peer `access` does not allow: an EACCES reply
// saying why, counted in `security`, and a warning in the log (at most one
// a second per guest, with the number refused meanwhile). The caller
// closes it.
void refuse_connection(Connection& c, const GuestAccess& access, GuestSecurity& security);

// Handles one message on the connection. Returns false when the connection
// must be closed (peer gone, protocol error, failed attach).
bool handle_connection_message(Engine& eng, Connection& c);

}  // namespace vrdma::shim
