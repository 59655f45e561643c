// A listening Unix socket made in a directory the shim holds open: the
// guest sockets and the control socket.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <string>

#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

// Binds a non-blocking socket of `type` (SOCK_SEQPACKET: the guests' and
// the control socket; SOCK_STREAM: a VM guest's ivshmem.sock, which QEMU
// connects to) named `name` in the directory
// `dir_fd` and listens. The name is bound through /proc/self/fd/N/NAME, so
// the socket lands in that very directory, not wherever its path leads now
// (`shown`, the path, is used only where /proc is missing: a run directory
// that nobody else can change). A stale entry of that name is removed first
// (unlinkat: never followed). The socket is created with `mask` as umask, so
// nobody gets in before the caller sets its owner and mode.
bool bind_socket_at(int dir_fd, const std::string& shown, const std::string& name, mode_t mask, int backlog,
                    UniqueFd& out, std::string& error, int type = SOCK_SEQPACKET);

}  // namespace vrdma::shim
