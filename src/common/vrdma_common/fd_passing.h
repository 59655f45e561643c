// Sending and receiving one message with file descriptors (SCM_RIGHTS) on a
// SOCK_SEQPACKET UNIX socket.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "vrdma_common/unique_fd.h"

namespace vrdma {

// The most fds recv_with_fds accepts in one message.
constexpr size_t kMaxPassedFds = 8;
// The most fds send_with_fds sends in one message (more than a receiver
// accepts, so that test clients can send such messages).
constexpr size_t kMaxSentFds = 16;

// Returns 0 or a positive errno. Retries on EINTR. `flags` are added to
// MSG_NOSIGNAL (for example MSG_DONTWAIT).
int send_with_fds(int sock, const void* buf, size_t len, std::span<const int> fds, int flags = 0);

// Receives one message into buf (at most len bytes). On success returns the
// message length (0 means the peer closed) and appends the received fds to
// `fds`; on failure returns -errno. A message that was truncated, or that
// carried more than kMaxPassedFds fds, fails with -EMSGSIZE and its fds are
// closed.
long recv_with_fds(int sock, void* buf, size_t len, std::vector<UniqueFd>& fds);

}  // namespace vrdma
