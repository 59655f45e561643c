// The guest socket: listening, and the messages of one connection (Attach,
// AddSegment, RemoveSegment; docs/protocol.md, Attach).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "device_model.h"
#include "engine.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

// Creates the guest's listening SOCK_SEQPACKET socket at `path` (mode 0666).
bool open_guest_socket(const std::string& path, UniqueFd& out, std::string& error);

struct Connection {
    uint64_t id = 0;
    const GuestIdentity* guest = nullptr;
    UniqueFd sock;
    uint64_t ctx_id = 0;  // 0 until attached
    pid_t pid = -1;
    uid_t uid = 0;
    Charges charges;  // Res::Connections of the guest, given back when closed
};

// Reads the peer's credentials (SO_PEERCRED) into the connection.
void read_peer_credentials(Connection& c);

// Handles one message on the connection. Returns false when the connection
// must be closed (peer gone, protocol error, failed attach).
bool handle_connection_message(Engine& eng, Connection& c);

}  // namespace vrdma::shim
