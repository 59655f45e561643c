// I/O on file descriptors a guest shares with the shim (its kick and
// cmd-done eventfds, its async event pipe). SCM_RIGHTS hands the shim the
// guest's own open file description: the guest can clear O_NONBLOCK on it at
// any moment, saturate the eventfd counter, fill the pipe or race the shim to
// read. A plain read() or write() could then block the shim's only thread
// for ever. These set O_NONBLOCK again when it was cleared and, for the race
// that remains, bound the call with a timer (kGuestFdTimeoutMs); they return
// what read()/write() return (-1 with errno EAGAIN or EINTR when they would
// have blocked). EINTR means the guard timer fired: the call was blocking,
// so the guest had cleared O_NONBLOCK; Context::check_blocked then detaches
// that context.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace vrdma::shim {

constexpr long kGuestFdTimeoutMs = 5;

ssize_t guest_fd_write(int fd, const void* buf, size_t len);
ssize_t guest_fd_read(int fd, void* buf, size_t len);

// Is `fd` an eventfd (not a file, pipe or socket that could behave otherwise)?
bool is_eventfd(int fd);

}  // namespace vrdma::shim
