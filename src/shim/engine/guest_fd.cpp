#include "guest_fd.h"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

// A real-time signal of our own (libFuzzer and others use SIGALRM); its
// handler does nothing, installed without SA_RESTART so that a blocked
// read()/write() returns EINTR. Each thread has its own timer, aimed at
// itself (SIGEV_THREAD_ID): a worker's guard never interrupts another.
int guard_signal() { return SIGRTMIN + 3; }

void on_guard(int) {}

struct Guard {
    timer_t timer{};
    bool ok = false;
    Guard() {
        struct sigaction sa{};
        sa.sa_handler = on_guard;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;
        if (::sigaction(guard_signal(), &sa, nullptr) != 0) return;
        sigevent sev{};
        sev.sigev_notify = SIGEV_THREAD_ID;
        sev.sigev_signo = guard_signal();
        sev._sigev_un._tid = ::gettid();  // sigev_notify_thread_id, which glibc 2.36 does not name
        ok = ::timer_create(CLOCK_MONOTONIC, &sev, &timer) == 0;
        if (!ok) LOG_WARN("cannot create the guest I/O timer: guest fds rely on O_NONBLOCK alone");
    }
    ~Guard() {
        if (ok) ::timer_delete(timer);
    }
    void arm(long ms) {
        if (!ok) return;
        itimerspec its{};
        its.it_value.tv_sec = ms / 1000;
        its.it_value.tv_nsec = (ms % 1000) * 1'000'000;
        ::timer_settime(timer, 0, &its, nullptr);
    }
    void disarm() {
        if (!ok) return;
        itimerspec its{};
        ::timer_settime(timer, 0, &its, nullptr);
    }
};

Guard& guard() {
    thread_local Guard g;
    return g;
}

void ensure_nonblocking(int fd) {
    int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0 && !(fl & O_NONBLOCK)) ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

}  // namespace

ssize_t guest_fd_write(int fd, const void* buf, size_t len) {
    ensure_nonblocking(fd);
    Guard& g = guard();
    g.arm(kGuestFdTimeoutMs);
    ssize_t n = ::write(fd, buf, len);
    int e = errno;
    g.disarm();
    errno = e;
    return n;
}

ssize_t guest_fd_read(int fd, void* buf, size_t len) {
    ensure_nonblocking(fd);
    Guard& g = guard();
    g.arm(kGuestFdTimeoutMs);
    ssize_t n = ::read(fd, buf, len);
    int e = errno;
    g.disarm();
    errno = e;
    return n;
}

bool is_eventfd(int fd) {
    char path[64], target[64] = {};
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = ::readlink(path, target, sizeof(target) - 1);
    return n > 0 && std::strcmp(target, "anon_inode:[eventfd]") == 0;
}

}  // namespace vrdma::shim
