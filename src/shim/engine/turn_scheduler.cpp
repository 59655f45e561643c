#include "turn_scheduler.h"

#include "context.h"
#include "dormancy.h"

namespace vrdma::shim {

void TurnScheduler::begin_turn(Context& ctx, uint64_t start) {
    GuestLoad& load = ctx.guest().load;
    ++load.turns;
    budget_ = kTurnBudget * ctx.guest().weight;
    small_ = kSmallTurn * ctx.guest().weight;
    if (load.pass != load_.passes) {
        // Deficit round robin: what the guest's last turn took beyond its
        // budget (the small one if it gave way; the slice or WQE that
        // crossed it, a turn preempted) comes off the next ones, up to
        // kMaxDebtBudgets full budgets, so that shares follow the weights
        // however coarse a slice is against the budget.
        const uint64_t b = load.pass_budget ? load.pass_budget : budget_;
        load.pass_used = load.pass_used > b ? std::min(load.pass_used - b, kMaxDebtBudgets * budget_) : 0;
        load.pass = load_.passes;
    }
    used_ = carried_ = load.pass_used;
    ctx_ = &ctx;
    guest_ = &load;
    yielded_ = false;
    yield_check_at_ = small_;
    in_debt_ = used_ >= budget_;
    start_ns_ = start;
    checks_ = 0;
}

void TurnScheduler::end_turn(uint64_t end) {
    const uint64_t d = end - start_ns_;
    GuestLoad& load = *guest_;
    load.busy_ns += d;
    load.pass_used = in_debt_ ? used_ : cost(d);
    // What the pass's use is measured against: the small budget if the
    // turn gave way to another guest.
    load.pass_budget = yielded_ ? small_ : budget_;
    if (yielded_) ++load.yields;
    load_.busy_ns += d;
    ctx_ = nullptr;
    guest_ = nullptr;
}

bool TurnScheduler::spent_timed() {
    if (spent()) return true;
    if (++checks_ % kTurnClockEvery) return false;
    // WQEs are charged by count: the turn's real time counts too.
    used_ = cost(clock_.now() - start_ns_);
    return spent();
}

bool TurnScheduler::yield_to_others() {
    if (ctx_ && others_have_work()) {
        yielded_ = true;
        budget_ = used_;  // spent: the rest waits for the next pass
        return true;
    }
    yield_check_at_ = used_ + small_;
    return false;
}

// Whether a context of another guest than the turn's has work waiting: a
// doorbell or work bits it wrote, QPs the shim marked, a dormant context
// woken. Reads what the next pass would read, for at most kYieldScan
// contexts a check.
bool TurnScheduler::others_have_work() {
    if (dormancy_.has_woken()) return true;
    const std::vector<Context*>& awake = dormancy_.awake();
    const size_t n = awake.size();
    const size_t k = std::min(n, kYieldScan);
    const GuestIdentity* mine = &ctx_->guest();
    for (size_t i = 0; i < k; ++i) {
        Context* c = awake[(scan_from_ + i) % n];
        if (c->dead || &c->guest() == mine) continue;
        if (c->has_marked()) return true;
        const abi::ControlBlock* cb = c->control();
        if (cb->work_summary.load(std::memory_order_relaxed) != 0 ||
            cb->doorbell.load(std::memory_order_relaxed) != c->last_doorbell)
            return true;
    }
    scan_from_ += k;
    return false;
}

}  // namespace vrdma::shim
