#include "guest_security.h"

namespace vrdma::shim {

bool GuestSecurity::Limiter::due(uint64_t now_ns, unsigned long long& more) {
    if (last_ns && now_ns - last_ns < 1'000'000'000) {
        ++unlogged;
        return false;
    }
    last_ns = now_ns;
    more = unlogged;
    unlogged = 0;
    return true;
}

}  // namespace vrdma::shim
