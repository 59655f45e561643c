// Whether the host has a core for every thread that wants one: the worker's
// idle pass gives its core away (sched_yield) only where someone may be
// waiting for it.
//
// On a host with a spare core per process the yield gives the core to
// nobody and costs a system call (about half a microsecond), most of an
// idle pass; a message that arrives waits on average half a pass. On a
// host with fewer cores than busy threads (2 cores, a shim and two polling
// guests) the yield is what lets a guest that shares the shim's core run.
// Timing the yields cannot tell the two apart (a yield returns quickly on
// 2 cores too: docs/performance.md "The idle pass"); the kernel's count of
// runnable threads can: yielding stops only while that count, this thread
// included, is at most the number of CPUs this process may run on.
//
// The count is /proc/loadavg's fourth field (nr_running, host-wide), read
// from an open descriptor: again after kSpareSampleNs while it says there
// are cores to spare, after kSampleNs while it says there are not. A
// thread that starts polling beside a worker that stopped yielding is seen
// within a millisecond (and until then the scheduler still preempts the
// shim for it at its tick); a wrong "spare" costs the guests CPU time on a
// loaded host, a wrong "none" only the yields of one more sample.
#pragma once

#include <cstdint>

#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

class CoreCensus {
public:
    static constexpr uint64_t kSampleNs = 10'000'000, kSpareSampleNs = 1'000'000;

    // `loadavg`: the file to read (tests name one of their own).
    explicit CoreCensus(const char* loadavg = "/proc/loadavg");
    // Whether the last count (read again once its time above has passed at
    // `now_ns`) left no runnable thread without a CPU. False where the
    // count cannot be read: then the worker yields, as it always did.
    bool cores_to_spare(uint64_t now_ns);
    unsigned cpus() const { return cpus_; }

    // The rule, for tests: `running` runnable threads on `cpus` CPUs.
    static bool spare(unsigned running, unsigned cpus) { return running > 0 && cpus > 0 && running <= cpus; }
    // nr_running from /proc/loadavg's text (0: not found).
    static unsigned parse_running(const char* text, size_t len);

private:
    UniqueFd loadavg_;
    unsigned cpus_ = 0;
    uint64_t next_sample_ns_ = 0;
    bool spare_ = false;
};

}  // namespace vrdma::shim
