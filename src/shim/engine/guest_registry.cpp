#include "guest_registry.h"

#include <algorithm>

namespace vrdma::shim {

GuestIdentity& GuestRegistry::add(const std::string& name, uint16_t lid, uint64_t guid, bool controlled_qkeys) {
    auto g = std::make_unique<GuestIdentity>();
    g->controlled_qkeys = controlled_qkeys;
    g->name = name;
    g->lid = lid;
    g->guid = guid;
    usages_.push_back(std::make_unique<GuestUsage>(name, quotas_, global_));
    guests_.push_back(std::move(g));
    return *guests_.back();
}

GuestIdentity* GuestRegistry::find(const GuestIdentity& guest) {
    for (auto& g : guests_)
        if (g.get() == &guest) return g.get();
    return nullptr;
}

GuestIdentity* GuestRegistry::find_active(const std::string& name) {
    for (auto& g : guests_)
        if (g->name == name && !g->removed) return g.get();
    return nullptr;
}

GuestUsage* GuestRegistry::usage_of(const GuestIdentity& guest) {
    for (size_t i = 0; i < guests_.size(); ++i)
        if (guests_[i].get() == &guest) return usages_[i].get();
    return nullptr;
}

GuestSecurity& GuestRegistry::security_of(const GuestIdentity& guest) {
    if (GuestIdentity* g = find(guest)) return g->security;
    thread_local GuestSecurity unknown;  // a guest of no engine (tests): counted nowhere that matters
    return unknown;
}

void GuestRegistry::set_pkeys(const GuestIdentity& guest, std::vector<uint16_t> pkeys) {
    if (GuestIdentity* g = find(guest); g && !pkeys.empty()) g->pkeys = std::move(pkeys);
}

void GuestRegistry::set_weight(const GuestIdentity& guest, uint32_t weight) {
    if (GuestIdentity* g = find(guest)) g->weight = std::clamp(weight, 1u, kMaxGuestWeight);
}

}  // namespace vrdma::shim
