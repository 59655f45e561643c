// The QP engine: every guest and attached context of this shim, the QPN
// registry that finds the QP a (LID, QPN) names, the route table of
// destination LIDs, and one pass of work over all contexts (commands, send
// queues, flushes). One engine per worker (worker.h): only its worker's
// thread calls it, and nothing here locks; what the workers of a shim
// share is in shared_tables.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "context.h"
#include "device_model.h"
#include "guess_throttle.h"
#include "local_transport.h"
#include "quota.h"
#include "recent_ids.h"
#include "route_table.h"
#include "shared_tables.h"
#include "work_queue.h"

namespace vrdma::shim {

uint64_t monotonic_ns();
class MulticastForwarder;

class Engine {
public:
    // `shared`: the tables of the shim this engine is a worker of (null: its
    // own, for an engine alone: tests, fuzzing).
    explicit Engine(Quotas quotas = {}, SharedTables* shared = nullptr);
    ~Engine();

    const GuestIdentity& add_guest(const std::string& name, uint16_t lid, uint64_t guid,
                                   bool controlled_qkeys = false);
    const std::vector<std::unique_ptr<GuestIdentity>>& guests() const { return guests_; }
    // Guest `guest` leaves (vrdmactl guest remove): each of its contexts
    // sees the device fatal (IBV_EVENT_DEVICE_FATAL; the caller then closes
    // their connections, which frees everything and tells their QPs' peers),
    // its port goes down and its LID is no longer routed here.
    void remove_guest(const GuestIdentity& guest);
    // Sets the P_Key table of a guest (before any context attaches).
    void set_pkeys(const GuestIdentity& guest, std::vector<uint16_t> pkeys);
    // Sets a guest's weight (1..kMaxGuestWeight): its budget per pass is
    // weight times kTurnBudget (vrdma-shim --guest NAME:weight=W).
    void set_weight(const GuestIdentity& guest, uint32_t weight);
    // The counters of what isolation stopped for `guest` (guest_security.h).
    GuestSecurity& security_of(const GuestIdentity& guest);
    // Remote access errors per source LID; sources that keep making them
    // have their RDMA requests dropped (guess_throttle.h).
    GuessThrottle& guess_throttle() { return shared_->guess_throttle(); }
    // UD datagrams with a wrong qkey per (source LID, target LID); pairs
    // that keep sending them have their datagrams dropped (qkey_guard.h).
    GuessThrottle& qkey_throttle() { return shared_->qkey_throttle(); }
    const Quotas& quotas() const { return quotas_; }
    // What every context of `guest` holds together (quota.h). Null for a
    // guest this engine does not serve.
    GuestUsage* usage_of(const GuestIdentity& guest);
    const GlobalUsage& global_usage() const { return shared_->global_usage(); }
    SharedTables& shared() { return *shared_; }
    // The shim's multicast groups as this worker last saw them (fetched
    // again only after a change: multicast_groups.h).
    const McastView& multicast_view() {
        const uint64_t g = shared_->multicast().generation();
        if (g != mcast_generation_) {
            mcast_view_ = shared_->multicast().view();
            mcast_generation_ = g;
        }
        return *mcast_view_;
    }
    // Multicast datagrams to peer shims (the fabric's, on the worker that
    // runs it; null: none).
    void set_multicast_forwarder(MulticastForwarder* f) { mcast_forwarder_ = f; }
    MulticastForwarder* multicast_forwarder() const { return mcast_forwarder_; }
    // Room for one multicast payload, gathered once and delivered from here.
    uint8_t* multicast_payload() { return mcast_payload_.data(); }

    // Attaches a process: maps its arena (validated) and creates its context.
    // Returns null with a positive errno in `err` on failure.
    Context* attach(const GuestIdentity& guest, UniqueFd arena, uint64_t gva, uint64_t len, UniqueFd kick,
                    UniqueFd cmd_done, UniqueFd async, int& err, std::string* why = nullptr);
    // Destroys a context and every resource it owns.
    void detach(uint64_t ctx_id);
    Context* find_context(uint64_t ctx_id);
    std::vector<uint64_t> dead_contexts() const;
    size_t context_count() const { return contexts_.size(); }
    template <typename F>
    void for_each_context(F&& f) {
        for (auto& entry : contexts_) f(*entry.second);
    }

    // One pass over every context. Returns true if anything progressed.
    bool poll_once();
    // Earliest deadline of a QP waiting for an RNR or retry timer (0: none).
    uint64_t next_deadline_ns() const;
    void set_sleeping(bool sleeping);

    // Idle contexts (protocol.md "Idle contexts"): one without work for
    // kDormantAfterNs goes dormant, out of the passes, until its guest
    // kicks its eventfd (the daemon calls wake) or the shim has work for it
    // (Context::request_pass). Every kSweepNs a pass also looks at the
    // dormant ones.
    static constexpr uint64_t kDormantAfterNs = 1'000'000;
    static constexpr uint64_t kSweepNs = 1'000'000;
    void wake(Context& ctx);
    size_t dormant_count() const { return dormant_count_; }
    // Every context looks at all its queues on the next pass (a route or a
    // transport's room changed).
    void rescan_all();
    // Shutdown: every context's shim_state becomes fatal and DEVICE_FATAL is
    // posted to its async pipe.
    void mark_all_fatal();
    // Port 1 of a guest goes down (PORT_ERR) or up (PORT_ACTIVE), posted to
    // every context of that guest. False if no guest has that name.
    bool set_port_active(const std::string& guest, bool active);
    std::vector<int> kick_fds() const;

    // QPN registry: this engine's QPs by number. The numbers themselves are
    // unique per shim (SharedTables: random, quarantined once freed).
    struct QpRef {
        Context* ctx = nullptr;
        Qp* qp = nullptr;
        uint32_t handle = 0;
        explicit operator bool() const { return qp != nullptr; }
    };
    uint32_t alloc_qpn() { return shared_->alloc_qpn(); }
    // Registers QP `handle` of `ctx` as `qpn` (taken shim-wide if it was not).
    void register_qp(uint32_t qpn, Context& ctx, uint32_t handle);
    void unregister_qp(uint32_t qpn);
    QpRef find_qp(uint16_t lid, uint32_t qpn);
    // The QP of this shim with `qpn`, whatever its LID (device completions
    // name the device QP, whose QPN is the guest's: hca_bind.h).
    QpRef find_qp_by_qpn(uint32_t qpn);
    bool qpn_taken(uint32_t qpn) const { return shared_->qpn_taken(qpn); }
    uint64_t new_incarnation() { return shared_->new_incarnation(); }
    uint32_t alloc_srqn() { return shared_->alloc_srqn(); }
    // QP (gone_lid, gone_qpn) of another shim or worker vanished or failed:
    // the QP (lid, qpn) of this engine connected to exactly it goes to error
    // with `event` (QP_FATAL; what a device's responder raises when the
    // failure was its own: fail_responder_of).
    void fail_peer_qp(uint16_t gone_lid, uint32_t gone_qpn, uint16_t lid, uint32_t qpn,
                      int event = IBV_EVENT_QP_FATAL);
    // RC QP `qp` of `ctx` completed a request with a remote error its
    // device reported (REM_ACCESS, REM_INV_REQ or REM_OP): the responder QP
    // on a device is in error, but the device may neither say so nor flush
    // the receives the shim hands it later (rxe in Linux 6.1). The
    // responder's guest QP goes to error here, on its worker or its shim
    // (through the transport that reaches it), with the event a device
    // raises for that error.
    void fail_responder_of(Context& ctx, const Qp& qp, uint32_t status);

    // Destination LID -> transport. Every guest of this engine is routed to
    // the local transport; peer shims add their LID ranges.
    RouteTable& routes() { return routes_; }
    // Whether `lid` names a guest this engine serves itself (its local
    // transport), and whether `t` is that transport: the one answer to "is
    // it here?" for responders, bindings and the transports' receive sides.
    bool serves(uint16_t lid) const { return routes_.lookup(lid) == &local_; }
    bool is_here(const Transport* t) const { return t == &local_; }
    // The transports that keep objects of their own beside the guests'
    // (transport.h, "The guest's objects"): the device's, with --hca. The
    // command handlers go through them. A keeper outlives the engine.
    void add_object_keeper(Transport* t) { keepers_.push_back(t); }
    const std::vector<Transport*>& object_keepers() const { return keepers_; }
    // The GID of the shim's RDMA device (a keeper's), null without one.
    const uint8_t* device_gid() const;
    // What a guest's vrdma0 offers here: its limits (device_model.h), less
    // what a keeper takes away.
    abi::DeviceAttr device_attr(const Context& ctx) const;
    // The fabric's directory of UD QPs on the peers' devices (null: no fabric).
    void set_ud_directory(UdDirectory* d) { ud_directory_ = d; }
    UdDirectory* ud_directory() const { return ud_directory_; }
    LocalTransport& local_transport() { return local_; }
    // The one WQE being worked on (too large for the stack of every pass).
    SendWork& scratch() { return scratch_; }
    Pins& scratch_pins() { return scratch_pins_; }

    uint64_t now() const { return clock_(); }
    void set_clock(uint64_t (*clock)()) { clock_ = clock; }

    // Work per turn (protocol.md "Work per turn"): a guest's queues (all its
    // contexts together) get at most kTurnBudget of work per pass (times
    // the guest's weight, GuestIdentity::weight), counted
    // in bytes: each WQE started counts kWqeCost, a copy under
    // kTimedCopyBytes its length, a larger copy the time it took at
    // kTurnBudget per kTurnNs (shares are of the shim's time: a copy from
    // memory out of cache costs its guest more than one from cache), but
    // never less than a quarter of its length; and the turn as a whole
    // costs at least its time at that rate. QPs left with work are
    // looked at on the next pass, after every other guest had its turn. A
    // large transfer moves kSliceBytes per turn (local_transport.h).
    static constexpr uint64_t kTurnBudget = 256 * 1024;
    static constexpr uint64_t kTurnNs = 10'000;
    static constexpr uint64_t kWqeCost = 2048;
    static constexpr uint64_t kSliceBytes = 64 * 1024;
    static constexpr uint64_t kTimedCopyBytes = 4096;
    // Turns sized by what is waiting (protocol.md "Work per turn"): once a
    // turn has used kSmallTurn (times its guest's weight) and another
    // guest of this worker has work, the turn ends at the next check (the
    // deficit round robin then counts against the small budget, so shares
    // still follow the weights); a guest alone keeps the whole budget. The
    // local transport copies a large transfer kCopySlice at a time and
    // checks between slices, so a small message waits behind at most one
    // slice or kSmallTurn of small WQEs, whatever the neighbours post.
    static constexpr uint64_t kSmallTurn = 16 * 1024;
    static constexpr uint64_t kCopySlice = 16 * 1024;
    // Other contexts looked at per check (rotating): the check's cost is
    // bounded however many contexts the worker has.
    static constexpr size_t kYieldScan = 64;
    // Debt carried to the next passes: at most this many full budgets.
    static constexpr uint64_t kMaxDebtBudgets = 4;
    void charge_turn(uint64_t bytes) { turn_used_ += bytes; }
    // A copy of `bytes` that took `ns` (0: not timed).
    void charge_copy(uint64_t bytes, uint64_t ns) {
        turn_used_ += ns ? std::max(ns * kTurnBudget / kTurnNs, bytes / 4) : bytes;
    }
    // Passes and the time of turns that found work (guest_load.h).
    const WorkerLoad& worker_load() const { return worker_load_; }
    // True once the guest's budget for this pass is used by its charges.
    // The requester asks before each WQE with turn_spent_timed, which also
    // counts the time the turn took (the clock read every kTurnClockEvery
    // calls); looking at an idle QP costs nothing.
    bool turn_spent() {
        if (turn_used_ >= turn_budget_) return true;
        return turn_used_ >= yield_check_at_ && yield_to_others();
    }
    bool turn_spent_timed();
    // Runs `f` with no turn budget (what it uses is still charged to the
    // turn afterwards): for a command that must see every work request
    // posted before it (ResizeCq), whose queues bound the work.
    template <typename F>
    void outside_budget(F&& f) {
        const uint64_t budget = turn_budget_, check = yield_check_at_;
        turn_budget_ = yield_check_at_ = UINT64_MAX;
        f();
        turn_budget_ = budget;
        yield_check_at_ = check;
    }
    static constexpr uint32_t kTurnClockEvery = 8;

private:
    // One context's turn in the current pass (poll_once, sweep): its
    // commands and queues; `t` is the pass's clock. Only within a pass: the
    // guest's budget is per pass.
    bool process_context(Context& ctx, uint64_t t);
    // What the turn has used: its charges, or its time so far at the
    // budget's rate, whichever is more.
    uint64_t turn_cost(uint64_t elapsed_ns) const {
        return std::max(turn_used_, turn_carried_ + elapsed_ns * kTurnBudget / kTurnNs);
    }
    // Tells the guest of `ctx` whether to kick its eventfd after a doorbell.
    static void tell_sleeping(Context& ctx, bool sleeping) {
        ctx.control()->shim_sleeping.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
    }
    // The turn has used its small budget: it ends if another guest of this
    // worker has work (true), else the next check is one small budget on.
    bool yield_to_others();
    bool others_have_work();
    bool process_commands(Context& ctx);
    bool sweep(uint64_t t);
    void destroy_resources(Context& ctx);
    void fail_peers_of(uint16_t lid, const std::unordered_set<uint32_t>& qpns);

    Quotas quotas_;
    std::unique_ptr<SharedTables> own_shared_;  // when no shim's tables were given
    SharedTables* shared_;
    std::vector<std::unique_ptr<GuestIdentity>> guests_;
    std::vector<std::unique_ptr<GuestUsage>> usages_;  // parallel to guests_
    std::map<uint64_t, std::unique_ptr<Context>> contexts_;
    struct QpLoc {
        Context* ctx;
        uint32_t handle;
    };
    std::unordered_map<uint32_t, QpLoc> qpns_;
    uint64_t (*clock_)() = monotonic_ns;
    RouteTable routes_;
    LocalTransport local_;
    std::vector<Transport*> keepers_;
    UdDirectory* ud_directory_ = nullptr;
    MulticastForwarder* mcast_forwarder_ = nullptr;
    std::shared_ptr<const McastView> mcast_view_;
    uint64_t mcast_generation_ = 0;
    std::vector<uint8_t> mcast_payload_ = std::vector<uint8_t>(kPortMtuBytes);
    SendWork scratch_;
    Pins scratch_pins_;
    uint64_t turn_used_ = 0;  // of the context being processed
    uint64_t turn_budget_ = kTurnBudget;  // its guest's: kTurnBudget times its weight
    uint64_t turn_carried_ = 0;  // what its guest used before this turn in this pass
    uint64_t turn_start_ns_ = 0;
    Context* turn_ctx_ = nullptr;       // the context whose turn it is
    uint64_t turn_small_ = kSmallTurn;  // its guest's small budget
    uint64_t yield_check_at_ = UINT64_MAX;
    bool turn_yielded_ = false;
    size_t yield_scan_from_ = 0;
    uint32_t turn_checks_ = 0;
    WorkerLoad worker_load_;
    std::vector<Context*> awake_;               // the contexts a pass looks at
    std::vector<uint64_t> wake_ids_, wake_batch_;  // dormant contexts with work (by id)
    size_t dormant_count_ = 0;
    uint64_t next_sweep_ns_ = 0;
    bool sleeping_ = false;
};

}  // namespace vrdma::shim
