// Idle contexts (protocol.md "Idle contexts"): which contexts of a worker
// the passes look at. One without work for kDormantAfterNs goes dormant,
// out of the passes, until its guest kicks its eventfd (the worker calls
// Engine::wake) or the shim has work for it (Context::request_pass puts
// its id on the woken list, which the next pass takes). Every kSweepNs a
// pass also looks at the dormant ones, in case something of the shim's own
// was missed.
//
// Whether the shim sleeps is told to every awake context's guest (its next
// doorbell then kicks the eventfd); a dormant context's guest was told the
// shim sleeps, and stays told.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "context.h"

namespace vrdma::shim {

class Dormancy {
public:
    static constexpr uint64_t kDormantAfterNs = 1'000'000;
    static constexpr uint64_t kSweepNs = 1'000'000;
    using Contexts = std::map<uint64_t, std::unique_ptr<Context>>;

    // A context attached at `now`: awake.
    void add(Context& ctx, uint64_t now);
    // A context detached.
    void remove(Context& ctx);
    // The contexts a pass looks at (in no particular order).
    const std::vector<Context*>& awake() const { return awake_; }
    size_t dormant_count() const { return dormant_count_; }
    // Contexts the shim asked a pass for since the last take_woken.
    bool has_woken() const { return !woken_.empty(); }
    // Calls `wake_id(id)` for each of them.
    template <typename F>
    void take_woken(F&& wake_id) {
        if (woken_.empty()) return;
        batch_.swap(woken_);
        for (uint64_t id : batch_) wake_id(id);
        batch_.clear();
    }
    // `ctx` joins the passes again (if it was dormant), as if it had just
    // worked at `now`.
    void wake(Context& ctx, uint64_t now);
    void set_sleeping(bool sleeping);
    // Once every kSweepNs (true when this pass at `t` is one): contexts idle
    // for kDormantAfterNs go dormant after one last look with `process`, and
    // the dormant ones of `all` are looked at; a context `process` found
    // work for stays or comes back. True if any had work.
    template <typename Process>
    bool sweep(uint64_t t, const Contexts& all, Process&& process);

    // Tells the guest of `ctx` whether to kick its eventfd after a doorbell.
    static void tell_sleeping(Context& ctx, bool sleeping) {
        ctx.control()->shim_sleeping.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
    }

private:
    // Whether `c` may go dormant at `t`.
    bool may_doze(const Context& c, uint64_t t) const;

    std::vector<Context*> awake_;
    std::vector<uint64_t> woken_, batch_;  // dormant contexts with work (by id)
    size_t dormant_count_ = 0;
    uint64_t next_sweep_ns_ = 0;
    bool sleeping_ = false;
};

// A context goes dormant only after it was told the shim sleeps and then
// looked at once more, so that a doorbell rung before it was told is not
// missed (the handshake of protocol.md "Doorbell and sleeping", per
// context).
template <typename Process>
bool Dormancy::sweep(uint64_t t, const Contexts& all, Process&& process) {
    if (t < next_sweep_ns_) return false;
    next_sweep_ns_ = t + kSweepNs;
    bool progress = false;
    for (size_t i = 0; i < awake_.size();) {
        Context& c = *awake_[i];
        if (!may_doze(c, t)) {
            ++i;
            continue;
        }
        tell_sleeping(c, true);
        if (process(c)) {
            tell_sleeping(c, sleeping_);
            progress = true;
            ++i;
            continue;
        }
        c.dormant = true;
        ++dormant_count_;
        awake_[i] = awake_.back();  // order among contexts does not matter
        awake_.pop_back();
    }
    if (dormant_count_)
        for (auto& [id, c] : all)
            if (c->dormant && !c->dead && process(*c)) {
                wake(*c, t);
                progress = true;
            }
    return progress;
}

}  // namespace vrdma::shim
