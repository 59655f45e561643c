#include "key_table.h"

#include "secure_random.h"

namespace vrdma::shim {

uint32_t KeyTable::alloc(uint32_t handle) {
    for (;;) {
        uint32_t k = secure_random_u32();
        if (k == 0 || live_.count(k) || recent_.contains(k)) continue;
        live_.emplace(k, handle);
        return k;
    }
}

void KeyTable::release(uint32_t key) {
    if (live_.erase(key)) recent_.add(key);
}

}  // namespace vrdma::shim
