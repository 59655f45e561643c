// Completion events inside a VM (docs/protocol.md "VM tenants"), by
// polling. The shim cannot write a pipe of the VM's, and without a driver
// for the device's interrupts nothing in the VM is told when a completion
// arrives. So a vrdma completion channel in a VM is a pipe whose write end
// the process keeps, and a thread of the context (started with its first
// arming of a CQ that has a channel) looks at the armed CQs: when one holds
// a completion that is unpolled and raised no event yet (and, for a
// solicited-only arming, is a solicited receive, abi::kCqeSolicited, or an
// error), it writes the CQ's record into the channel and the
// arming is consumed, the rule of the shim's events (cq_events.h). It looks
// every 10 us for 2 ms after an arming or an event, then backs off to every
// 1 ms, and looks every 50 ms while nothing is armed. The same thread
// moves the async events the shim puts in the control block's ring into
// the async pipe. When the device goes it closes the channels' write ends
// and its copy of the async pipe's, so that ibv_get_cq_event fails and
// ibv_get_async_event reports IBV_EVENT_DEVICE_FATAL, as on a host.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "context.h"

namespace vrdma::prov {

struct Cq;

// The context's event thread and what it looks at (Context::vm_events).
struct VmEventPoller {
    std::mutex mu;
    std::condition_variable cv;
    struct Armed {
        Cq* cq;
        bool solicited_only;
    };
    std::vector<Armed> armed;  // under mu
    bool stop = false;         // under mu
    bool device_gone = false;  // under mu: the channels' write ends are closed
    bool armed_anew = false;   // under mu: an arming since the thread last looked
    std::thread thread;
};

// Starts the context's event thread (at attach): it moves the shim's async
// event records from the control block's VmAsyncRing into the process's
// async pipe (abi.h), and raises the completion events.
void vm_events_start(Context& ctx);
// req_notify_cq of a CQ with a channel, inside a VM (not under arm_mu).
void vm_events_arm(Context& ctx, Cq& cq, bool solicited_only);
// destroy_cq inside a VM: the CQ is armed no more. Returns the records
// written for it (what the shim's DestroyCq answer says on a host).
uint32_t vm_events_forget(Context& ctx, Cq& cq);
// ~Context: stops the thread.
void vm_events_stop(Context& ctx);

}  // namespace vrdma::prov
