// Work per turn (protocol.md "Work per turn"): how much of a worker's time
// each guest's turn in a pass may take. A guest's queues (all its contexts
// together) get at most kTurnBudget of work per pass, times the guest's
// weight (GuestIdentity::weight), counted in bytes:
// - each WQE started counts kWqeCost;
// - a copy under kTimedCopyBytes counts its length, a larger one the time
//   it took at kTurnBudget per kTurnNs (shares are of the shim's time: a
//   copy from memory out of cache costs its guest more than one from
//   cache), but never less than a quarter of its length;
// - and the turn as a whole costs at least its time at that rate.
// QPs left with work are looked at on the next pass, after every other
// guest had its turn. A large transfer moves kSliceBytes per turn
// (local_transport.h).
//
// Turns sized by what is waiting: once a turn has used kSmallTurn (times
// its guest's weight) and another guest of this worker has work, the turn
// ends at the next check (the deficit round robin then counts against the
// small budget, so shares still follow the weights); a guest alone keeps
// the whole budget. The local transport copies a large transfer
// kCopySlice at a time and checks between slices, so a small message waits
// behind at most one slice or kSmallTurn of small WQEs, whatever the
// neighbours post.
#pragma once

#include <algorithm>
#include <cstdint>

#include "clock.h"
#include "guest_load.h"

namespace vrdma::shim {

class Context;
class Dormancy;

class TurnScheduler {
public:
    static constexpr uint64_t kTurnBudget = 256 * 1024;
    static constexpr uint64_t kTurnNs = 10'000;
    static constexpr uint64_t kWqeCost = 2048;
    static constexpr uint64_t kSliceBytes = 64 * 1024;
    static constexpr uint64_t kTimedCopyBytes = 4096;
    static constexpr uint64_t kSmallTurn = 16 * 1024;
    static constexpr uint64_t kCopySlice = 16 * 1024;
    // Other contexts looked at per check (rotating): the check's cost is
    // bounded however many contexts the worker has.
    static constexpr size_t kYieldScan = 64;
    // Debt carried to the next passes: at most this many full budgets.
    static constexpr uint64_t kMaxDebtBudgets = 4;
    // turn_spent_timed reads the clock every this many calls.
    static constexpr uint32_t kTurnClockEvery = 8;

    // `dormancy`: which contexts may have work when a turn asks whether to
    // give way; `clock`: the engine's.
    TurnScheduler(const Dormancy& dormancy, const Clock& clock) : dormancy_(dormancy), clock_(clock) {}

    // A pass begins; its number.
    uint64_t begin_pass() { return ++load_.passes; }
    // The turn of `ctx` in the current pass begins at `start`: its guest's
    // budget for the pass, less what its other contexts used in it and the
    // debt of its last turns.
    void begin_turn(Context& ctx, uint64_t start);
    // The turn ends at `end`: its time and use go to its guest's and the
    // worker's load (vrdmactl load).
    void end_turn(uint64_t end);

    void charge(uint64_t bytes) { used_ += bytes; }
    // A copy of `bytes` that took `ns` (0: not timed).
    void charge_copy(uint64_t bytes, uint64_t ns) {
        used_ += ns ? std::max(ns * kTurnBudget / kTurnNs, bytes / 4) : bytes;
    }
    // True once the guest's budget for this pass is used by its charges.
    // The requester asks before each WQE with spent_timed, which also
    // counts the time the turn took (the clock read every kTurnClockEvery
    // calls); looking at an idle QP costs nothing.
    bool spent() {
        if (used_ >= budget_) return true;
        return used_ >= yield_check_at_ && yield_to_others();
    }
    bool spent_timed();
    // Runs `f` with no turn budget (what it uses is still charged to the
    // turn afterwards): for a command that must see every work request
    // posted before it (ResizeCq), whose queues bound the work.
    template <typename F>
    void outside_budget(F&& f) {
        const uint64_t budget = budget_, check = yield_check_at_;
        budget_ = yield_check_at_ = UINT64_MAX;
        f();
        budget_ = budget;
        yield_check_at_ = check;
    }
    // Passes and the time of turns that found work (guest_load.h).
    const WorkerLoad& worker_load() const { return load_; }

private:
    // What the turn has used: its charges, or its time so far at the
    // budget's rate, whichever is more.
    uint64_t cost(uint64_t elapsed_ns) const {
        return std::max(used_, carried_ + elapsed_ns * kTurnBudget / kTurnNs);
    }
    // The turn has used its small budget: it ends if another guest of this
    // worker has work (true), else the next check is one small budget on.
    bool yield_to_others();
    bool others_have_work();

    const Dormancy& dormancy_;
    const Clock& clock_;
    WorkerLoad load_;
    Context* ctx_ = nullptr;      // the context whose turn it is
    GuestLoad* guest_ = nullptr;  // its guest's load
    uint64_t used_ = 0;
    uint64_t budget_ = kTurnBudget;  // its guest's: kTurnBudget times its weight
    uint64_t small_ = kSmallTurn;    // its guest's small budget
    uint64_t carried_ = 0;           // what its guest used before this turn in this pass
    uint64_t start_ns_ = 0;
    uint64_t yield_check_at_ = UINT64_MAX;
    bool in_debt_ = false;  // the turn began with its budget spent: its time is not charged again
    bool yielded_ = false;
    size_t scan_from_ = 0;
    uint32_t checks_ = 0;
};

}  // namespace vrdma::shim
