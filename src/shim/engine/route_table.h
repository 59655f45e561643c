// The route table: destination LID -> the transport that reaches it (the
// local transport for a guest of this shim, the peer shim's transport for a
// LID that peer owns). O(1) per lookup: one pointer per unicast LID.
#pragma once

#include <cstdint>
#include <vector>

namespace vrdma::shim {

class Transport;

class RouteTable {
public:
    static constexpr uint32_t kMaxLid = 0xbfff;  // unicast LIDs are 1..0xbfff

    RouteTable() : routes_(kMaxLid + 1, nullptr) {}

    // Routes [first, last] to `t`; false if a LID there is routed already
    // to another transport or out of the unicast range.
    bool add(uint16_t first, uint16_t last, Transport* t);
    // Routes `lid` to `t` whatever it went to before (a guest of a peer
    // shim that one of the fabric's links announced: fabric.h).
    void assign(uint16_t lid, Transport* t);
    // Removes every LID routed to `t`.
    void remove(Transport* t);
    // Removes the route of `lid`, whatever it goes to.
    void remove_lid(uint16_t lid);
    Transport* lookup(uint16_t lid) const { return lid <= kMaxLid ? routes_[lid] : nullptr; }
    // Changes whenever a route is added or removed: QPs bound to a route at
    // an older generation look it up again.
    uint32_t generation() const { return generation_; }

private:
    std::vector<Transport*> routes_;
    uint32_t generation_ = 1;
};

}  // namespace vrdma::shim
