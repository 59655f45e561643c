// Reading and writing guest memory that the guest may take away.
//
// MR memory can be a file the guest still controls (a /dev/shm file, SysV
// shared memory, shared anonymous memory): truncating it makes the shim's
// mapping raise SIGBUS where the pages were. Every payload copy and atomic
// on MR memory therefore runs under a thread-local recovery point: a SIGBUS
// inside it abandons the operation and reports the faulting address, and the
// transfer completes with an error (docs/protocol.md "Guest memory"). A
// SIGBUS anywhere else is a bug in the shim and kills it as before.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vrdma::shim {

// Installs the process's SIGBUS handler (idempotent; main() calls it at
// start, tests before they copy).
void install_fault_guard();

// memmove that survives SIGBUS: true if all `n` bytes moved; false if a
// page was gone, with its address in *fault_addr (bytes before it may have
// moved).
bool guarded_memmove(void* dst, const void* src, size_t n, uintptr_t* fault_addr);

// The responder's atomics on guest memory; false if the page was gone.
bool guarded_fetch_add(uint64_t* target, uint64_t add, uint64_t* old);
bool guarded_compare_swap(uint64_t* target, uint64_t compare, uint64_t swap, uint64_t* old);
// The responder's atomic write (8 aligned bytes stored at once); false if
// the page was gone.
bool guarded_atomic_store(uint64_t* target, uint64_t value);

}  // namespace vrdma::shim
