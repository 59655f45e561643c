#include "key_table.h"

#include "secure_random.h"

namespace vrdma::shim {

uint32_t KeyTable::alloc(uint32_t handle, KeyKind kind) {
    for (;;) {
        uint32_t k = secure_random_u32();
        uint32_t index = k >> 8;
        if (index == 0 || live_.contains(index) || recent_.contains(index)) continue;
        live_.set(index, Entry{handle, k, kind});
        return k;
    }
}

bool KeyTable::insert(uint32_t key, uint32_t handle, KeyKind kind) {
    const uint32_t index = key >> 8;
    if (index == 0 || live_.contains(index)) return false;
    live_.set(index, Entry{handle, key, kind});
    return true;
}

bool KeyTable::retag(uint32_t key, uint32_t new_key) {
    Entry* e = live_.find(key >> 8);
    if (!e || e->key != key || (new_key >> 8) != (key >> 8)) return false;
    e->key = new_key;
    return true;
}

void KeyTable::release(uint32_t key) {
    const Entry* e = live_.find(key >> 8);
    if (!e || e->key != key) return;
    live_.erase(key >> 8);
    recent_.add(key >> 8);
}

}  // namespace vrdma::shim
