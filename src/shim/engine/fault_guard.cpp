#include "fault_guard.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace vrdma::shim {
namespace {

// The recovery point of the copy running on this thread, if any. Volatile
// and fenced: to the compiler the stores around a memmove look dead.
thread_local sigjmp_buf* volatile t_recover = nullptr;
thread_local uintptr_t t_fault_addr = 0;

void on_sigbus(int sig, siginfo_t* info, void*) {
    if (sigjmp_buf* env = t_recover) {
        t_recover = nullptr;
        t_fault_addr = reinterpret_cast<uintptr_t>(info->si_addr);
        // siglongjmp leaves the handler without restoring the signal mask
        // (sigsetjmp(env, 0): saving it would cost a syscall per copy).
        // SA_NODEFER keeps SIGBUS unblocked, unless something wraps the
        // handler without it (ThreadSanitizer does): unblock it here, on
        // the fault path only, or the next fault would kill the shim.
        sigset_t bus;
        sigemptyset(&bus);
        sigaddset(&bus, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
        siglongjmp(*env, 1);
    }
    // Not inside a guarded access: die of it as if no handler existed.
    signal(sig, SIG_DFL);
    raise(sig);
}

}  // namespace

void install_fault_guard() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa {};
        sa.sa_sigaction = on_sigbus;
        // SA_NODEFER: siglongjmp leaves the handler without restoring the
        // mask, so SIGBUS must not be blocked while it runs.
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, nullptr);
    });
}

// Guest memory is the guests' and the devices' to race on (RDMA gives no
// order between a remote write and a local access): ThreadSanitizer does
// not watch the shim's accesses to it, as it does not watch a device's
// DMA. Its atomics, which lock a table of its own, are not used either: a
// SIGBUS inside one would jump out with that lock held.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#define GUEST_MEMORY_ACCESS __attribute__((no_sanitize("thread")))
namespace {
void unwatched_begin() { __tsan_ignore_thread_begin(); }
void unwatched_end() { __tsan_ignore_thread_end(); }
}  // namespace
#else
#define GUEST_MEMORY_ACCESS
namespace {
void unwatched_begin() {}
void unwatched_end() {}
}  // namespace
#endif

// Each guarded function keeps the access in a separate frame from
// sigsetjmp's caller state: nothing it changes after sigsetjmp is read after
// a jump back except through volatile or thread-local storage.
bool guarded_memmove(void* dst, const void* src, size_t n, uintptr_t* fault_addr) {
    sigjmp_buf env;
    unwatched_begin();
    if (sigsetjmp(env, 0)) {
        // No unwatched_end: ThreadSanitizer's signal wrapper cleared the
        // thread's ignores before it called the handler, which never
        // returned to restore them.
        if (fault_addr) *fault_addr = t_fault_addr;
        return false;
    }
    t_recover = &env;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    std::memmove(dst, src, n);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_recover = nullptr;
    unwatched_end();
    return true;
}

GUEST_MEMORY_ACCESS bool guarded_fetch_add(uint64_t* target, uint64_t add, uint64_t* old) {
    sigjmp_buf env;
    if (sigsetjmp(env, 0)) return false;
    t_recover = &env;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    *old = __atomic_fetch_add(target, add, __ATOMIC_SEQ_CST);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_recover = nullptr;
    return true;
}

GUEST_MEMORY_ACCESS bool guarded_compare_swap(uint64_t* target, uint64_t compare, uint64_t swap, uint64_t* old) {
    sigjmp_buf env;
    if (sigsetjmp(env, 0)) return false;
    t_recover = &env;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    uint64_t expected = compare;
    __atomic_compare_exchange_n(target, &expected, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    *old = expected;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_recover = nullptr;
    return true;
}

GUEST_MEMORY_ACCESS bool guarded_atomic_store(uint64_t* target, uint64_t value) {
    sigjmp_buf env;
    if (sigsetjmp(env, 0)) return false;
    t_recover = &env;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    __atomic_store_n(target, value, __ATOMIC_SEQ_CST);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_recover = nullptr;
    return true;
}

}  // namespace vrdma::shim
