#include "dormancy.h"

#include <algorithm>

namespace vrdma::shim {

void Dormancy::add(Context& ctx, uint64_t now) {
    ctx.set_wake_list(&woken_);
    ctx.last_work_ns = now;
    awake_.push_back(&ctx);
}

void Dormancy::remove(Context& ctx) {
    if (ctx.dormant)
        --dormant_count_;
    else
        std::erase(awake_, &ctx);
}

void Dormancy::wake(Context& ctx, uint64_t now) {
    ctx.wake_queued = false;
    if (!ctx.dormant) return;
    ctx.dormant = false;
    --dormant_count_;
    ctx.last_work_ns = now;
    tell_sleeping(ctx, sleeping_);
    awake_.push_back(&ctx);
}

void Dormancy::set_sleeping(bool sleeping) {
    sleeping_ = sleeping;
    for (Context* c : awake_) tell_sleeping(*c, sleeping);
}

// Not one with work the shim knows of (a rescan, a timer, marked QPs), and
// not one whose guest could never wake it: without a kick eventfd
// (in-process tests).
bool Dormancy::may_doze(const Context& c, uint64_t t) const {
    return !c.dead && c.kick_fd() >= 0 && !c.rescan && !c.next_deadline_ns && !c.has_marked() &&
           t - c.last_work_ns >= kDormantAfterNs;
}

}  // namespace vrdma::shim
