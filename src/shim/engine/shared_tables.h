// What the workers of one shim share (docs/protocol.md "Workers"): the
// numbers that must be unique shim-wide (QPNs and their quarantine, QP
// incarnations, SRQ numbers, context ids), the shim-wide mapping count, the rkey
// and qkey guess throttles (a source's guesses count wherever its targets
// are served), and the owners of the device's UD QPs. Everything else
// belongs to one worker's engine.
//
// Thread safety: QPNs are taken and given back by control commands only,
// under a mutex; incarnations, SRQ numbers and context ids are atomic
// counters; the
// mapping count is atomic (global_usage: GuestUsage takes with a
// compare-exchange); the throttles lock only on their slow paths (a
// source that made an error). No fast path of a worker takes a lock here
// but one: a UD datagram the device delivers from another worker's guest
// looks its source up under device_ud's mutex (held for one hash lookup).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "guess_throttle.h"
#include "multicast_groups.h"
#include "quota.h"
#include "recent_ids.h"

namespace vrdma::shim {

class SharedTables {
public:
    SharedTables();
    SharedTables(const SharedTables&) = delete;
    SharedTables& operator=(const SharedTables&) = delete;

    // QPNs are unique per shim, drawn at random (24 bits, never 0 or 1) and
    // not handed out again until kQpnQuarantine other QPNs were freed after
    // them: a stale QPN names nothing rather than a newcomer.
    static constexpr size_t kQpnQuarantine = 1u << 16;
    // A fresh QPN, taken (0: none left).
    uint32_t alloc_qpn();
    // Takes `qpn` (a device's QP number, hca_bind.h); false if it is taken
    // or in quarantine.
    bool take_qpn(uint32_t qpn);
    // Gives a QPN back: it goes into quarantine.
    void release_qpn(uint32_t qpn);
    bool qpn_taken(uint32_t qpn) const;

    // Each QP created is a new incarnation: an RC or UC connection binds
    // the two incarnations it joined (responder.cpp), not just their QPNs.
    // Never 0 ("not known"); counted from a random start, so that a
    // restarted shim's QPs are not taken for its earlier ones by peers.
    uint64_t new_incarnation() {
        uint64_t v = next_incarnation_.fetch_add(1, std::memory_order_relaxed);
        return v ? v : next_incarnation_.fetch_add(1, std::memory_order_relaxed);
    }
    uint32_t alloc_srqn() { return next_srqn_.fetch_add(1, std::memory_order_relaxed) & 0xffffff; }
    // Context ids, unique shim-wide (the log names contexts by them).
    uint64_t new_context_id() { return next_context_id_.fetch_add(1, std::memory_order_relaxed); }

    GlobalUsage& global_usage() { return global_; }
    GuessThrottle& guess_throttle() { return guess_throttle_; }
    GuessThrottle& qkey_throttle() { return qkey_throttle_; }
    // The multicast groups of the shim's guests' UD QPs (its own locking).
    MulticastGroups& multicast() { return multicast_; }

    // The UD QPs of this shim's guests on its RDMA device, by QPN (hca_ud.h):
    // a datagram the device delivers names only the source QPN, and its
    // QP may be a guest's of another worker. Set when a UD QP goes onto the
    // device (a QPN taken again overwrites it); read, under the lock, only
    // for a datagram from this shim's own device GID whose QPN the
    // receiving worker does not have.
    void set_device_ud(uint32_t qpn, uint16_t lid, uint64_t guid);
    bool device_ud(uint32_t qpn, uint16_t& lid, uint64_t& guid) const;

private:
    mutable std::mutex qpn_mutex_;
    std::unordered_set<uint32_t> qpns_;
    RecentIds recent_qpns_{kQpnQuarantine};
    std::atomic<uint64_t> next_incarnation_;
    std::atomic<uint32_t> next_srqn_{1};
    std::atomic<uint64_t> next_context_id_{1};
    GlobalUsage global_;
    GuessThrottle guess_throttle_;  // rkeys, by source LID
    GuessThrottle qkey_throttle_;   // qkeys, by (source LID, target LID)
    MulticastGroups multicast_;
    struct UdOwner {
        uint16_t lid;
        uint64_t guid;
    };
    mutable std::mutex device_ud_mutex_;
    std::unordered_map<uint32_t, UdOwner> device_ud_;
};

}  // namespace vrdma::shim
