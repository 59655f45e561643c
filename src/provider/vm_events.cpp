#include "vm_events.h"

#include <infiniband/verbs.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "events.h"
#include "objects.h"
#include "vrdma/ring.h"

namespace vrdma::prov {

namespace {

// Every 10 us for 2 ms after an arming or an event (a ping-pong's next
// message is near), then backing off to every millisecond.
constexpr long kShortPauseNs = 10'000, kLongestPauseNs = 1'000'000;
constexpr auto kBusyFor = std::chrono::milliseconds(2);

// Whether a completion wakes an arming: any, or for a solicited-only one a
// solicited receive or an error.
bool wakes(const abi::Cqe& e, bool solicited_only) {
    return !solicited_only || (e.flags & abi::kCqeSolicited) || e.status != IBV_WC_SUCCESS;
}

// Whether `cq`, armed (its arm_mu held), gets its event now, by the shim's
// rule on a host (protocol.md "Completion channels"):
//  - a completion past both the consumer index the application published
//    and the end of what the last event covered (the newer of the two),
//    that wakes the arming. The event covers the first such completion
//    only (`end`, `unpolled` true): the shim raises the event as that
//    completion lands, and every later one finds the arming used and waits
//    for the next; this thread sees them in batches, and an event covering
//    the whole batch would leave an application that polls once per event
//    (perftest -e) waiting for a wake-up that never comes;
//  - or, failing that, a completion that landed after the arming and that
//    the application polled before this thread looked (`unpolled` false):
//    on a host the shim raised its event as it landed, and an application
//    that waits for one event per completion (perftest -e, whose single
//    channel serves its send and receive CQs) counts on it.
bool due(const Cq& cq, bool solicited_only, uint32_t& end, bool& unpolled) {
    // The mark before the consumer index: Cq::consume_to clears it only after
    // publishing the index that passed the event's completions.
    const bool pending = cq.vm_event_pending.load(std::memory_order_acquire);
    const uint32_t prod = cq.hdr->producer.load(std::memory_order_acquire);
    const uint32_t cons = cq.hdr->consumer.load(std::memory_order_acquire);
    if (!ring_valid_producer(prod, cons, cq.entries)) return false;
    uint32_t from = cons;
    if (pending) {
        const uint32_t last = cq.vm_event_prod.load(std::memory_order_relaxed);
        if (ring_count(prod, last, cq.entries) < ring_count(prod, cons, cq.entries)) from = last;
    }
    for (; from != prod; from = ring_next(from, cq.entries)) {
        if (wakes(cq.cqes[ring_slot(from, cq.entries)], solicited_only)) {
            end = ring_next(from, cq.entries);
            unpolled = true;
            return true;
        }
    }
    // How many landed since the arming: by the count, not the indices, which
    // come round every twice the entries. Read after the producer index (and
    // taken before it at the arming), it is never below what the indices
    // from vm_arm_prod to prod hold.
    const uint32_t landed = cq.hdr->produced.load(std::memory_order_acquire) - cq.vm_arm_produced;
    unpolled = false;
    if (landed >= cq.entries) return true;  // their slots were written over: some woke it
    for (uint32_t i = cq.vm_arm_prod; i != prod; i = ring_next(i, cq.entries))
        if (wakes(cq.cqes[ring_slot(i, cq.entries)], solicited_only)) return true;
    return false;
}

// The async records the shim put into the control block's ring since the
// last look, into the async pipe (a full pipe drops them, as the shim's
// write would).
void forward_async(Context& ctx, uint32_t& cons) {
    auto* ring =
        reinterpret_cast<abi::VmAsyncRing*>(reinterpret_cast<uint8_t*>(ctx.cb) + abi::kVmAsyncRingOffset);
    const uint32_t prod = ring->producer.load(std::memory_order_acquire);
    if (prod == cons || !ring_valid_producer(prod, cons, abi::kVmAsyncSlots)) return;
    for (; cons != prod; cons = ring_next(cons, abi::kVmAsyncSlots)) {
        abi::AsyncRecord rec;
        std::memcpy(&rec, &ring->slots[ring_slot(cons, abi::kVmAsyncSlots)], sizeof(rec));
        if (ctx.vm_async_w) (void)!::write(ctx.vm_async_w.get(), &rec, sizeof(rec));
    }
    ring->consumer.store(cons, std::memory_order_release);
}

void run(Context& ctx, VmEventPoller& p) {
    // The kernel's default slack (50 us) would make the short pauses five
    // times longer.
    ::prctl(PR_SET_TIMERSLACK, 1000UL);
    long pause_ns = kShortPauseNs;
    auto last_check = std::chrono::steady_clock::now();
    auto busy_until = last_check;
    uint32_t async_cons = 0;
    std::unique_lock lock(p.mu);
    while (!p.stop) {
        if (!p.device_gone) forward_async(ctx, async_cons);
        // Whether the device is still there, ten times a second.
        if (!p.device_gone && std::chrono::steady_clock::now() - last_check > std::chrono::milliseconds(100)) {
            last_check = std::chrono::steady_clock::now();
            if (shim_lost(ctx)) {
                p.device_gone = true;
                p.armed.clear();
                close_vm_channels(ctx);
                ctx.vm_async_w.reset();  // with the agent's end gone too: DEVICE_FATAL
            }
        }
        if (p.armed.empty()) {
            p.cv.wait_for(lock, std::chrono::milliseconds(50));
            continue;
        }
        if (p.armed_anew) {
            p.armed_anew = false;
            busy_until = std::chrono::steady_clock::now() + kBusyFor;
        }
        bool raised = false;
        for (size_t i = 0; i < p.armed.size();) {
            Cq& cq = *p.armed[i].cq;
            // A resize replaces the ring under arm_mu: look again next time.
            std::unique_lock arm(cq.arm_mu, std::try_to_lock);
            uint32_t end = 0;
            bool unpolled = false;
            if (!arm || !due(cq, p.armed[i].solicited_only, end, unpolled)) {
                ++i;
                continue;
            }
            // What this event covers, before the record: the application may
            // poll as soon as it reads it (Cq::consume_to).
            if (unpolled) {
                cq.vm_event_prod.store(end, std::memory_order_relaxed);
                cq.vm_event_pending.store(true, std::memory_order_seq_cst);
            }
            cq.vm_armed = false;  // the next arming starts from the producer index then
            const uint64_t record = reinterpret_cast<uintptr_t>(&cq.vcq.cq);
            if (::write(cq.vm_channel_fd, &record, sizeof(record)) == ssize_t(sizeof(record))) ++cq.vm_events;
            p.armed.erase(p.armed.begin() + long(i));
            raised = true;
        }
        const auto now = std::chrono::steady_clock::now();
        if (raised) busy_until = now + kBusyFor;
        pause_ns = now < busy_until ? kShortPauseNs : std::min(pause_ns * 2, kLongestPauseNs);
        lock.unlock();
        timespec ts{0, pause_ns};
        ::nanosleep(&ts, nullptr);
        lock.lock();
    }
}

}  // namespace

void vm_events_start(Context& ctx) {
    std::lock_guard lock(ctx.vm_events_mu);
    if (ctx.vm_events) return;
    ctx.vm_events = std::make_unique<VmEventPoller>();
    VmEventPoller* p = ctx.vm_events.get();
    p->thread = std::thread([&ctx, p] { run(ctx, *p); });
}

void vm_events_arm(Context& ctx, Cq& cq, bool solicited_only) {
    vm_events_start(ctx);
    VmEventPoller& p = *ctx.vm_events;
    {
        std::lock_guard lock(p.mu);
        if (p.device_gone) return;
        auto it = std::find_if(p.armed.begin(), p.armed.end(), [&](const auto& a) { return a.cq == &cq; });
        if (it != p.armed.end())
            it->solicited_only = solicited_only;  // the last arming says, as on a host
        else
            p.armed.push_back({&cq, solicited_only});
        p.armed_anew = true;
    }
    p.cv.notify_one();
}

uint32_t vm_events_forget(Context& ctx, Cq& cq) {
    std::lock_guard lock(ctx.vm_events_mu);
    if (!ctx.vm_events) return cq.vm_events;
    VmEventPoller& p = *ctx.vm_events;
    std::lock_guard plock(p.mu);
    std::erase_if(p.armed, [&](const auto& a) { return a.cq == &cq; });
    return cq.vm_events;
}

void vm_events_stop(Context& ctx) {
    std::unique_ptr<VmEventPoller> p;
    {
        std::lock_guard lock(ctx.vm_events_mu);
        p = std::move(ctx.vm_events);
    }
    if (!p) return;
    {
        std::lock_guard lock(p->mu);
        p->stop = true;
    }
    p->cv.notify_one();
    p->thread.join();
}

}  // namespace vrdma::prov
