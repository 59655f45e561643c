// The provider's verbs objects: each embeds the libibverbs object first so
// that the pointer libibverbs hands back converts directly.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "context.h"
#include "queue_lock.h"
#include "rdma_core_private.h"
#include "vrdma/abi.h"
#include "vrdma/ring.h"

namespace vrdma::prov {

// A protection domain, or a parent domain (ibv_alloc_parent_domain) over
// one: a parent domain carries its protection domain's handle, so every
// verb that takes a PD works on it unchanged.
struct Pd {
    ibv_pd ibv;
    Pd* protection = nullptr;  // set in a parent domain
    std::atomic<uint32_t> parent_domains{0};  // in a protection domain: those over it
};
inline Pd* to_pd(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
static_assert(std::is_standard_layout_v<Pd> && offsetof(Pd, ibv) == 0);

struct Dm;

struct Mr {
    verbs_mr vmr;
    uint32_t handle = 0;
    std::vector<uint32_t> segments;  // ids, one reference each
    Dm* dm = nullptr;                // an MR over device memory (ibv_reg_dm_mr)
    // IBV_ACCESS_ON_DEMAND registered with nothing shared (on_demand.h):
    // the ranges its faults have had shared so far (start, end), one per
    // segment, sorted by start (a vector: Mr stays standard-layout).
    bool on_demand = false;
    std::vector<std::pair<uintptr_t, uintptr_t>> shared;
};

struct Cq {
    verbs_cq vcq;
    Context* ctx = nullptr;
    uint32_t handle = 0;
    void* mem = nullptr;
    abi::RingHeader* hdr = nullptr;
    abi::CqNotify* notify = nullptr;
    abi::Cqe* cqes = nullptr;
    uint32_t entries = 0;
    uint32_t cons = 0;         // our consumer index
    uint32_t empty_polls = 0;
    uint32_t idle_polls = 0;   // empty polls that yielded the CPU (shim liveness checks)
    QueueLock mu;              // held by poll_cq, and from start_poll to end_poll
    QueueLock arm_mu;          // req_notify_cq against resize_cq (which holds mu, then this)
    // Extended CQ (ibv_create_cq_ex): the completion start_poll/next_poll
    // made current, and the index past it (published at end_poll).
    const abi::Cqe* cur = nullptr;
    uint32_t poll_cons = 0;
    // Events handed to the application (under Context::ev_mu): ibv_destroy_cq
    // waits until as many are acknowledged.
    uint32_t comp_read = 0;
    uint32_t async_read = 0;
    // Inside a VM (vm_events.h): the channel's write end (-1: no channel),
    // the records the context's event thread wrote (under its mutex), and
    // the producer index of the last one while its completions may still be
    // unpolled.
    int vm_channel_fd = -1;
    uint32_t vm_events = 0;
    std::atomic<uint32_t> vm_event_prod{0};
    std::atomic<bool> vm_event_pending{false};
    // Inside a VM, under arm_mu: whether an arming is unused, and the
    // producer index and count (RingHeader::produced) when it was made. A
    // completion past that index raises the event even if the application
    // polled it before the thread looked, as the shim raises it on a host
    // the moment it lands; the count tells twice the entries from none.
    bool vm_armed = false;
    uint32_t vm_arm_prod = 0;
    uint32_t vm_arm_produced = 0;  // RingHeader::produced at the arming
    // A poll (under mu) moves the consumer index to `to` and publishes it;
    // then, inside a VM, the last event's mark is cleared once the index
    // passed its completions. Released after the index, so that the event
    // thread, which reads the mark first, never sees it cleared with the
    // old index (and raises an event for a completion polled already).
    void consume_to(uint32_t to) {
        const uint32_t from = cons;
        cons = to;
        hdr->consumer.store(to, std::memory_order_release);
        if (!vm_event_pending.load(std::memory_order_relaxed)) return;
        const uint32_t last = vm_event_prod.load(std::memory_order_relaxed);
        if (ring_count(to, from, entries) >= ring_count(last, from, entries))
            vm_event_pending.store(false, std::memory_order_release);
    }
    // Whether the shim wrote the completion at index `idx`, by its owner bit
    // (abi.h kCqeOwner), read with acquire: its other bytes are then whole.
    // A poll reads no other line of the shim's than the completion's.
    bool cqe_ready(uint32_t idx) const {
        const abi::Cqe& e = cqes[ring_slot(idx, entries)];
        return (__atomic_load_n(&e.flags, __ATOMIC_ACQUIRE) & abi::kCqeOwner) == abi::cqe_owner(idx, entries);
    }
};

// A send queue, receive queue or SRQ ring of which the provider is the producer.
struct WorkQueue {
    void* mem = nullptr;
    abi::RingHeader* hdr = nullptr;
    uint8_t* slots = nullptr;
    uint32_t entries = 0;
    uint32_t stride = 0;
    uint32_t prod = 0;         // our producer index
    // The shim's consumer index as last read (under `mu`): read again only
    // when the ring looks full, so that a post does not pull the line the
    // shim writes at every WQE it finishes (wq_has_room).
    uint32_t cons_seen = 0;
    uint32_t max_sge = 0;
    uint32_t max_wr = 0;       // as reported to the application
    uint32_t work_slot = abi::kNoWorkSlot;  // the QP's bit in ControlBlock::work_bits
    QueueLock mu;              // held by a post, and from wr_start to wr_complete

    uint8_t* slot(uint32_t idx) { return slots + size_t(idx & (entries - 1)) * stride; }
};

struct Srq {
    verbs_srq vsrq;
    Context* ctx = nullptr;
    uint32_t handle = 0;
    uint32_t srq_limit = 0;
    WorkQueue rq;
    uint32_t async_read = 0;   // under Context::ev_mu
};

struct Qp {
    verbs_qp vqp;
    Context* ctx = nullptr;
    uint32_t handle = 0;
    uint32_t max_inline = 0;
    bool sq_sig_all = false;
    WorkQueue sq;
    WorkQueue rq;   // unused with an SRQ
    Srq* srq = nullptr;
    // Extended (ibv_qp_ex) send-path state between wr_start and wr_complete.
    uint32_t wr_prod = 0;
    uint32_t wr_cons = 0;
    uint8_t* wr_cur = nullptr;
    int wr_err = 0;
    uint32_t async_read = 0;   // under Context::ev_mu
};

// An XRC domain. Opened twice on the same file (ibv_open_xrcd with an fd),
// it is the same domain, counted; the domain is this context's own.
struct Xrcd {
    verbs_xrcd vx;  // vx.handle: the shim's handle
    bool has_file = false;
    dev_t dev = 0;
    ino_t ino = 0;
    uint32_t opens = 0;  // under the context's mem_mu
};
inline Xrcd* to_xrcd(ibv_xrcd* x) { return reinterpret_cast<Xrcd*>(x); }
inline Xrcd* to_xrcd(verbs_xrcd* x) { return reinterpret_cast<Xrcd*>(x); }

struct Ah {
    ibv_ah ibv;
    uint32_t handle = 0;
};

static_assert(std::is_standard_layout_v<Cq> && std::is_standard_layout_v<Qp> &&
              std::is_standard_layout_v<Srq> && std::is_standard_layout_v<Mr> &&
              std::is_standard_layout_v<Ah> && std::is_standard_layout_v<Xrcd>);

inline Cq* to_cq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Qp* to_qp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
inline Srq* to_srq(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }
inline Ah* to_ah(ibv_ah* a) { return reinterpret_cast<Ah*>(a); }
inline Mr* to_mr(verbs_mr* m) { return reinterpret_cast<Mr*>(m); }

}  // namespace vrdma::prov
