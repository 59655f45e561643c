// The guests one worker serves: each one's identity (device_model.h), and
// what its contexts hold together against its quotas (quota.h). Guests are
// never erased: one removed at run time keeps its identity, marked
// removed, because objects of its last moments may still name it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_model.h"
#include "quota.h"

namespace vrdma::shim {

class GuestRegistry {
public:
    using List = std::vector<std::unique_ptr<GuestIdentity>>;

    GuestRegistry(const Quotas& quotas, GlobalUsage& global) : quotas_(quotas), global_(global) {}
    GuestRegistry(const GuestRegistry&) = delete;
    GuestRegistry& operator=(const GuestRegistry&) = delete;

    GuestIdentity& add(const std::string& name, uint16_t lid, uint64_t guid, bool controlled_qkeys);
    // Every guest ever added, removed ones included.
    List::const_iterator begin() const { return guests_.begin(); }
    List::const_iterator end() const { return guests_.end(); }
    size_t size() const { return guests_.size(); }
    // `guest` if it is one of these (a caller's const reference, made
    // mutable), else null.
    GuestIdentity* find(const GuestIdentity& guest);
    // The guest called `name` that is not removed, or null.
    GuestIdentity* find_active(const std::string& name);
    // What every context of `guest` holds together; null for a guest this
    // worker does not serve.
    GuestUsage* usage_of(const GuestIdentity& guest);
    // The counters of what isolation stopped for `guest` (guest_security.h).
    GuestSecurity& security_of(const GuestIdentity& guest);
    // Its P_Key table (before any context attaches; empty: unchanged).
    void set_pkeys(const GuestIdentity& guest, std::vector<uint16_t> pkeys);
    // Its weight, clamped to 1..kMaxGuestWeight: its budget per pass is
    // weight times TurnScheduler::kTurnBudget.
    void set_weight(const GuestIdentity& guest, uint32_t weight);

private:
    Quotas quotas_;
    GlobalUsage& global_;
    List guests_;
    std::vector<std::unique_ptr<GuestUsage>> usages_;  // parallel to guests_
};

}  // namespace vrdma::shim
