// The lock of a queue's fast path (a CQ's poll, a send or receive queue's
// post), as rdma-core's providers take a spinlock there, not a mutex.
// Uncontended it is one atomic exchange to take and one store to give back:
// no call into libc, no system call, no second read-modify-write at unlock
// (a std::mutex costs about 60 instructions a lock and unlock, counted with
// callgrind, more than the rest of an empty poll).
//
// Contended, it spins briefly and then yields: the holder may be a thread
// that is not running (a preempted one, or the application between
// start_poll and end_poll), and on a host with fewer cores than busy
// threads a waiter that only spins would keep the holder off its core.
#pragma once

#include <sched.h>

#include <atomic>

namespace vrdma::prov {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

class QueueLock {
public:
    QueueLock() = default;
    QueueLock(const QueueLock&) = delete;
    QueueLock& operator=(const QueueLock&) = delete;

    void lock() noexcept {
        if (!held_.exchange(true, std::memory_order_acquire)) return;
        lock_contended();
    }
    bool try_lock() noexcept {
        return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire);
    }
    void unlock() noexcept { held_.store(false, std::memory_order_release); }

private:
    // Spins of a waiter before it starts giving its core away.
    static constexpr unsigned kSpins = 64;

    void lock_contended() noexcept {
        unsigned spins = 0;
        do {
            // Reads until it looks free, so that waiters do not pull the
            // line from the holder with exchanges.
            while (held_.load(std::memory_order_relaxed)) {
                if (spins < kSpins) {
                    cpu_relax();
                    ++spins;
                } else {
                    sched_yield();
                }
            }
        } while (held_.exchange(true, std::memory_order_acquire));
    }

    std::atomic<bool> held_{false};
};

}  // namespace vrdma::prov
