// The two epoll calls the daemon's thread and every worker make on their
// own epoll instance: watch an fd with a tag, stop watching it.
#pragma once

#include <sys/epoll.h>

#include <cstdint>

namespace vrdma::shim {

// Watches `fd` for `events`; the tag `data` comes back with each event.
inline bool epoll_watch(int epfd, int fd, uint32_t events, uint64_t data) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    return ::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

inline void epoll_unwatch(int epfd, int fd) {
    if (fd >= 0) ::epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
}

}  // namespace vrdma::shim
