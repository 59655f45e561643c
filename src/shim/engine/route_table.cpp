#include "route_table.h"

namespace vrdma::shim {

bool RouteTable::add(uint16_t first, uint16_t last, Transport* t) {
    if (first == 0 || first > last || last > kMaxLid || !t) return false;
    for (uint32_t l = first; l <= last; ++l)
        if (routes_[l] && routes_[l] != t) return false;
    for (uint32_t l = first; l <= last; ++l) routes_[l] = t;
    ++generation_;
    return true;
}

void RouteTable::assign(uint16_t lid, Transport* t) {
    if (lid == 0 || lid > kMaxLid || routes_[lid] == t) return;
    routes_[lid] = t;
    ++generation_;
}

void RouteTable::remove_lid(uint16_t lid) {
    if (lid > kMaxLid || !routes_[lid]) return;
    routes_[lid] = nullptr;
    ++generation_;
}

void RouteTable::remove(Transport* t) {
    for (auto& r : routes_)
        if (r == t) r = nullptr;
    ++generation_;
}

}  // namespace vrdma::shim
