// The provider's per-device-context state and the helpers every verb uses.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <unistd.h>

#include "arena.h"
#include "memory_registration.h"
#include "rdma_core_private.h"
#include "vrdma/abi.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::prov {

struct VmEventPoller;  // vm_events.h

struct Dm;
struct Mr;
struct Xrcd;

struct Context {
    verbs_context* vctx = nullptr;
    std::string socket_path;

    UniqueFd sock;      // SOCK_SEQPACKET connection to the shim
    UniqueFd kick;      // eventfd: provider -> shim
    UniqueFd cmd_done;  // eventfd: shim -> provider

    abi::ControlBlock* cb = nullptr;  // start of the arena
    void* arena_base = nullptr;
    size_t arena_len = 0;
    UniqueFd arena_fd;

    // Inside a VM (docs/protocol.md "VM tenants"): the arena is a region of
    // the VM device's memory (BAR2), and the shim is rung through the
    // device's Doorbell register (BAR0) instead of the kick eventfd; no
    // eventfd says a command is done.
    bool in_vm = false;
    void* vm_regs = nullptr;        // BAR0, mapped
    UniqueFd vm_bar0, vm_bar2;      // the device's resource files, from the agent
    // A copy of the async event pipe's write end (the agent holds the
    // other), for the event thread that moves the shim's records from the
    // control block's VmAsyncRing into it (vm_events.h).
    UniqueFd vm_async_w;

    // Commands and socket requests (one outstanding at a time).
    std::mutex cmd_mu;
    uint32_t cmd_prod = 0;
    uint32_t cmd_seq = 0;
    std::atomic<bool> dead{false};

    // Arena allocation and memory registration. Lock order: mem_mu, cmd_mu.
    std::mutex mem_mu;
    Arena arena;
    SegmentTable segments;
    uint64_t dm_bytes = 0;  // device memory allocated (verbs_dm.cpp)
    // ODP MRs by lkey (on_demand.h), and how many of them were registered
    // with nothing shared: the post paths look for faults only while some are.
    std::unordered_map<uint32_t, Mr*> odp_mrs;
    std::atomic<uint32_t> on_demand_mrs{0};
    std::vector<Xrcd*> xrcds;  // open XRC domains (verbs_xrc.cpp), under mem_mu

    // Imports (import.cpp): the ibv_contexts sharing this state (the one
    // that opened the device and those ibv_import_device made from its
    // command fd), and what ibv_import_pd, _mr and _dm may name, by
    // handle, under mem_mu. `mrs` and `dms` hold the objects as made (an
    // import copies from them).
    std::atomic<uint32_t> users{1};
    std::unordered_set<uint32_t> pd_handles;
    std::unordered_map<uint32_t, Mr*> mrs;
    std::unordered_map<uint32_t, Dm*> dms;
    uint32_t next_dm_handle = 1;

    abi::DeviceAttr dev_attr{};
    uint32_t lid = 0;
    uint32_t poll_spin = 64;

    // Events (events.h). ev_mu is taken last (never held across a command).
    // Objects whose events may be handed to the application; records that
    // name anything else are stale and dropped.
    std::mutex ev_mu;
    std::unordered_set<const void*> live_cqs, live_qps, live_srqs;
    // Destroyed objects that records still in a pipe may name: kept
    // allocated (so their address cannot be reused by a new object and
    // make a stale record look valid) until the context is freed.
    std::vector<std::pair<void*, void (*)(void*)>> zombies;  // object, its deleter
    uint32_t next_channel_id = 1;   // under cmd_mu
    bool fatal_reported = false;    // DEVICE_FATAL handed to the application
    // Inside a VM: the thread that forwards async events and raises
    // completion events (vm_events.h), started at attach.
    std::mutex vm_events_mu;
    std::unique_ptr<VmEventPoller> vm_events;

    ~Context();
};

// Allocated by libibverbs (calloc) around the verbs_context.
struct ContextShell {
    verbs_context vctx;
    Context* impl;
};

inline Context& ctx_of(ibv_context* ibctx) {
    auto* vctx = reinterpret_cast<verbs_context*>(reinterpret_cast<char*>(ibctx) -
                                                   offsetof(verbs_context, context));
    return *reinterpret_cast<ContextShell*>(vctx)->impl;
}

// Issues one command (protocol.md "Commands"). Returns 0 or a positive errno
// (the shim's status, or EIO when the shim is gone). resp may be null.
int command(Context& ctx, abi::CmdOp op, const void* req, size_t req_len, void* resp,
            size_t resp_len);

// Sends one socket request with fds and waits for its SockReply. Returns 0 or
// a positive errno (reply->message says why when the shim refused).
// `reply_fds` (if given) gets the fds the reply carried.
int sock_request(Context& ctx, const void* msg, size_t len, std::span<const int> fds,
                 abi::SockReply* reply, std::vector<UniqueFd>* reply_fds = nullptr);

// Kicks the shim if it sleeps (after it was told where the work is).
void ring_vm_doorbell(Context& ctx);
inline void kick_if_sleeping(Context& ctx) {
    if (ctx.cb->shim_sleeping.load(std::memory_order_seq_cst)) {
        if (ctx.vm_regs) return ring_vm_doorbell(ctx);
        uint64_t one = 1;
        ssize_t r = ::write(ctx.kick.get(), &one, sizeof(one));
        (void)r;  // EAGAIN: the counter is already nonzero, the shim will wake
    }
}

// After a command or a move of a queue without a work slot: the shim looks
// at every queue of the context.
inline void ring_doorbell(Context& ctx) {
    ctx.cb->doorbell.fetch_add(1, std::memory_order_seq_cst);
    kick_if_sleeping(ctx);
}

// After a producer index of the QP with work slot `slot` moved: the shim
// looks at that QP alone (ControlBlock::work_bits).
inline void ring_work_slot(Context& ctx, uint32_t slot) {
    if (slot >= abi::kWorkSlots) return ring_doorbell(ctx);
    const uint64_t bit = uint64_t(1) << (slot % 64);
    ctx.cb->work_bits[slot / 64].fetch_or(bit, std::memory_order_seq_cst);
    ctx.cb->work_summary.fetch_or(uint64_t(1) << (slot / 64), std::memory_order_seq_cst);
    kick_if_sleeping(ctx);
}

// Marks the context unusable (shim gone); later verbs fail with EIO.
void mark_dead(Context& ctx, const char* why);
// Why the device is gone, for a shim_state other than kShimRunning.
const char* shim_state_reason(uint32_t state);

// Ring memory from the arena (zeroed, 64-byte aligned), growing the arena by
// a new segment when it is full. nullptr with errno set on failure.
void* alloc_ring(Context& ctx, size_t bytes);
void free_ring(Context& ctx, void* p);

}  // namespace vrdma::prov
