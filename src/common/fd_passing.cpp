#include "vrdma_common/fd_passing.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace vrdma {

int send_with_fds(int sock, const void* buf, size_t len, std::span<const int> fds, int flags) {
    if (fds.size() > kMaxSentFds) return EINVAL;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxSentFds)] = {};
    iovec iov{const_cast<void*>(buf), len};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds.empty()) {
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    for (;;) {
        ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
        if (n >= 0) return size_t(n) == len ? 0 : EMSGSIZE;
        if (errno != EINTR) return errno;
    }
}

long recv_with_fds(int sock, void* buf, size_t len, std::vector<UniqueFd>& fds) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
    iovec iov{buf, len};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n;
    do {
        n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    std::vector<UniqueFd> got;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            got.emplace_back(fd);
        }
    }
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return -EMSGSIZE;  // `got` closes them
    for (auto& f : got) fds.push_back(std::move(f));
    return n;
}

}  // namespace vrdma
