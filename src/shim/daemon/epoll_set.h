// The epoll calls the daemon's thread and every worker make on their own
// epoll instance: watch an fd with a tag (a kind in the top 8 bits, an id
// below), stop watching it, wait and hand each event's kind and id on.
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

constexpr uint64_t epoll_tag(uint64_t kind, uint64_t id) { return (kind << 56) | id; }

// Waits up to `timeout_ms` (-1: no limit) and calls on_event(kind, id,
// events) for each event (at most 64 a call).
template <typename F>
void epoll_dispatch(int epfd, int timeout_ms, F&& on_event) {
    epoll_event evs[64];
    const int n = ::epoll_wait(epfd, evs, 64, timeout_ms);
    for (int i = 0; i < n; ++i) on_event(evs[i].data.u64 >> 56, evs[i].data.u64 & ((1ull << 56) - 1), evs[i].events);
}

}  // namespace vrdma::shim
