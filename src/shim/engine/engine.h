// The QP engine of one worker: its attached contexts and one pass of work
// over them (commands, send queues, flushes), with the parts it owns, each
// in its own header:
// - the guests it serves (guest_registry.h);
// - the QPN registry that finds the QP a (LID, QPN) names (qpn_registry.h);
// - the route table of destination LIDs (route_table.h) and the local
//   transport (local_transport.h);
// - the turn scheduler that shares the worker among guests
//   (turn_scheduler.h), and the dormancy of idle contexts (dormancy.h).
// One engine per worker (worker.h): only its worker's thread calls it, and
// nothing here locks; what the workers of a shim share is in
// shared_tables.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "clock.h"
#include "context.h"
#include "device_model.h"
#include "dormancy.h"
#include "guess_throttle.h"
#include "guest_registry.h"
#include "local_transport.h"
#include "qpn_registry.h"
#include "quota.h"
#include "recent_ids.h"
#include "route_table.h"
#include "shared_tables.h"
#include "turn_scheduler.h"
#include "work_queue.h"

namespace vrdma::shim {

class MulticastForwarder;

class Engine {
public:
    // `shared`: the tables of the shim this engine is a worker of (null: its
    // own, for an engine alone: tests, fuzzing).
    explicit Engine(Quotas quotas = {}, SharedTables* shared = nullptr);
    ~Engine();
    // Contexts point into it (Context::count_deaths_in): it stays where it is.
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // A guest served here from now on: its identity, routed to the local
    // transport.
    const GuestIdentity& add_guest(const std::string& name, uint16_t lid, uint64_t guid,
                                   bool controlled_qkeys = false);
    GuestRegistry& guests() { return guests_; }
    const GuestRegistry& guests() const { return guests_; }
    // Guest `guest` leaves (vrdmactl guest remove): each of its contexts
    // sees the device fatal (IBV_EVENT_DEVICE_FATAL; the caller then closes
    // their connections, which frees everything and tells their QPs' peers),
    // its port goes down and its LID is no longer routed here.
    void remove_guest(const GuestIdentity& guest);
    // Remote access errors per source LID; sources that keep making them
    // have their RDMA requests dropped (guess_throttle.h).
    GuessThrottle& guess_throttle() { return shared_->guess_throttle(); }
    // UD datagrams with a wrong qkey per (source LID, target LID); pairs
    // that keep sending them have their datagrams dropped (qkey_guard.h).
    GuessThrottle& qkey_throttle() { return shared_->qkey_throttle(); }
    const Quotas& quotas() const { return quotas_; }
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
    // `arena_offset`: where in `arena` it starts (a VM guest's arena is a
    // region of its device's memory: vm_port.h). A VM's context has no
    // cmd_done or async fd (-1).
    Context* attach(const GuestIdentity& guest, UniqueFd arena, uint64_t gva, uint64_t len, UniqueFd kick,
                    UniqueFd cmd_done, UniqueFd async, int& err, std::string* why = nullptr,
                    uint64_t arena_offset = 0);
    // Destroys a context and every resource it owns.
    void detach(uint64_t ctx_id);
    Context* find_context(uint64_t ctx_id);
    std::vector<uint64_t> dead_contexts() const;
    bool any_dead() const { return dead_count_ != 0; }
    size_t context_count() const { return contexts_.size(); }
    template <typename F>
    void for_each_context(F&& f) {
        for (auto& entry : contexts_) f(*entry.second);
    }

    // One pass over every context. Returns true if anything progressed.
    [[gnu::noinline]] bool poll_once();  // noinline: scripts/bench-instructions.sh counts it by name
    // Earliest deadline of a QP waiting for an RNR or retry timer (0: none).
    uint64_t next_deadline_ns() const;
    // The worker goes to sleep or wakes: told to the awake contexts' guests.
    void set_sleeping(bool sleeping) { dormancy_.set_sleeping(sleeping); }

    // Idle contexts (dormancy.h): `ctx`'s guest kicked its eventfd.
    void wake(Context& ctx) { dormancy_.wake(ctx, now()); }
    size_t dormant_count() const { return dormancy_.dormant_count(); }
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

    // This worker's QPs by number (qpn_registry.h).
    QpnRegistry& qpns() { return qpns_; }
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
    // A shim has at most one: the objects it keeps go in the guest
    // objects' one slot (resources.h, KeptObject). False when another
    // transport keeps objects here already.
    bool add_object_keeper(Transport* t) {
        if (!keepers_.empty() && keepers_[0] != t) return false;
        if (keepers_.empty()) keepers_.push_back(t);
        return true;
    }
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

    uint64_t now() const { return clock_.now(); }
    // The last reading of now(), made in this pass (at its start or at the
    // end of the turn before): what a turn starts from without a read.
    uint64_t latest_now() const { return clock_.latest; }
    void set_clock(uint64_t (*clock)()) { clock_.read = clock; }

    // The share of the worker each guest's turn gets (turn_scheduler.h):
    // the requester and the transports charge what they do to the turn
    // and stop when it is spent.
    TurnScheduler& turns() { return turns_; }
    const TurnScheduler& turns() const { return turns_; }

private:
    // One context's turn in the current pass (poll_once, sweep): its
    // commands and queues; `t` is the pass's clock. Only within a pass: the
    // guest's budget is per pass.
    bool process_context(Context& ctx, uint64_t t);
    bool process_commands(Context& ctx);
    void destroy_resources(Context& ctx);
    void fail_peers_of(uint16_t lid, const std::unordered_set<uint32_t>& qpns);

    Quotas quotas_;
    std::unique_ptr<SharedTables> own_shared_;  // when no shim's tables were given
    SharedTables* shared_;
    Clock clock_;
    GuestRegistry guests_;
    QpnRegistry qpns_;
    std::map<uint64_t, std::unique_ptr<Context>> contexts_;
    uint32_t dead_count_ = 0;  // contexts marked dead, not yet detached (Context::mark_dead)
    Dormancy dormancy_;
    TurnScheduler turns_{dormancy_, clock_};
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
};

}  // namespace vrdma::shim
