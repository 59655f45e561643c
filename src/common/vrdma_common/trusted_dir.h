// Who can change a directory, and who listens on a socket: the checks the
// shim makes before it serves a run directory, and the checks vrdma-run,
// vrdmactl and the provider make before they hand a shim anything
// (docs/reliability.md, "The host's files").
#pragma once

#include <sys/types.h>

#include <string>

#include "vrdma_common/unique_fd.h"

namespace vrdma {

// "uid 1000 (alice)".
std::string describe_uid(uid_t uid);

// Opens the absolute, link-free path `real` (what realpath() returned) from
// "/" one component at a time without following links, and checks that
// nobody but root and `trusted` can change any component: each belongs to
// root or `trusted` and is writable by neither its group nor others. An
// ancestor above the last `strict_tail` components may be writable by
// others if its sticky bit is set (as /tmp is): there nobody can rename or
// remove what they do not own. Returns an O_PATH fd of `real`; otherwise an
// empty fd and `error` naming the directory and the owner or mode at fault.
UniqueFd open_trusted_dir(const std::string& real, uid_t trusted, int strict_tail, std::string& error);

// The users a client accepts as a shim: root, itself, and the user named by
// VRDMA_SHIM_UID (a number; vrdma-run --shim-user sets it).
bool acceptable_shim_user(uid_t uid);

enum class ShimConnect { Ok, Untrusted, ConnectFailed };

// Connects to a shim's socket at `path` (a guest's vrdma.sock or the
// control socket), SOCK_SEQPACKET, after checking that the directory holding
// it and the run directory above it belong to an acceptable shim user
// (their owner: the shim's user) and nobody else can change them or their
// ancestors, and then that the process listening runs as that user
// (SO_PEERCRED). Nothing is sent: on Untrusted the socket is closed and
// `error` says why; on ConnectFailed `*connect_errno` holds connect()'s
// errno (EACCES: this user may not use the guest).
// `levels`: how many directories up from the socket are the shim's own and
// may not be sticky-excused: 2 for a guest's socket (its directory and the
// run directory), 1 for the control socket (in the run directory).
ShimConnect connect_to_shim(const std::string& path, UniqueFd& out, std::string& error,
                            int* connect_errno = nullptr, int levels = 2);

}  // namespace vrdma
