// What a transport does on a worker besides send(): its share of every
// pass, the fds it sleeps on, and its deadlines (docs/architecture.md
// "The transport contract"). The worker's loop drives its poll groups
// through this interface alone, in the order they were added, and names no
// transport: the fabric (fabric.h) and the RDMA device (hca_device.h) are
// poll groups. The local transport and the worker links need none (the
// engine's passes and the worker's inbox drive them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vrdma::shim {

class Engine;

class PollGroup {
public:
    virtual ~PollGroup() = default;

    // One pass, never blocking: what the requesters and responders queued
    // goes out, what arrived is handled. True if anything moved (the
    // worker then passes again before it sleeps: what moved may have
    // completed WQEs or marked QPs for the engine).
    virtual bool poll(Engine& eng) = 0;

    // The fds the worker's epoll watches for it (EPOLLIN), in a fixed
    // order; on_event(eng, i) when the i-th is readable.
    virtual std::vector<int> fds() const = 0;
    virtual void on_event(Engine& eng, size_t i) = 0;

    // Before the worker sleeps: from now on an event makes an fd readable
    // (a device CQ is armed). The worker passes once more after this.
    virtual void arm() {}

    // The earliest time the group needs a pass without an event
    // (monotonic ns; 0: none).
    virtual uint64_t next_deadline_ns() const { return 0; }

    // Every poll() already makes a system call (a read of each socket):
    // the idle worker looks at its epoll less often.
    virtual bool polls_with_syscalls() const { return false; }
};

}  // namespace vrdma::shim
