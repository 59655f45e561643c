#include "key_table.h"

#include "secure_random.h"

namespace vrdma::shim {

uint32_t KeyTable::alloc(uint32_t handle, KeyKind kind) {
    for (;;) {
        uint32_t k = secure_random_u32();
        uint32_t index = k >> 8;
        if (index == 0 || live_.count(index) || recent_.contains(index)) continue;
        live_.emplace(index, Entry{handle, k, kind});
        return k;
    }
}

bool KeyTable::insert(uint32_t key, uint32_t handle, KeyKind kind) {
    const uint32_t index = key >> 8;
    if (index == 0 || live_.count(index)) return false;
    live_.emplace(index, Entry{handle, key, kind});
    return true;
}

bool KeyTable::retag(uint32_t key, uint32_t new_key) {
    auto it = live_.find(key >> 8);
    if (it == live_.end() || it->second.key != key || (new_key >> 8) != (key >> 8)) return false;
    it->second.key = new_key;
    return true;
}

void KeyTable::release(uint32_t key) {
    auto it = live_.find(key >> 8);
    if (it == live_.end() || it->second.key != key) return;
    live_.erase(it);
    recent_.add(key >> 8);
}

}  // namespace vrdma::shim
