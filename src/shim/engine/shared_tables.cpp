#include "shared_tables.h"

#include <cstdio>

#include "secure_random.h"

namespace vrdma::shim {

SharedTables::SharedTables()
    : next_incarnation_(uint64_t(secure_random_u32()) << 32 | secure_random_u32()) {
    // Leave the shim's own allocations room under vm.max_map_count.
    uint64_t max_maps = 65530;
    if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
        unsigned long long v;
        if (std::fscanf(f, "%llu", &v) == 1 && v > 0) max_maps = v;
        std::fclose(f);
    }
    global_.mapping_limit = max_maps > 16384 ? max_maps - 8192 : max_maps / 2;
}

uint32_t SharedTables::alloc_qpn() {
    std::lock_guard<std::mutex> lock(qpn_mutex_);
    // Live and quarantined QPNs together stay far below 2^24 (the QP quota
    // of all guests is), so a few draws find a free one.
    if (qpns_.size() + recent_qpns_.size() >= 0xc00000) return 0;
    for (;;) {
        uint32_t q = secure_random_u32() & 0xffffff;
        // 0 and 1: IB's special QPs; 0xffffff: the multicast QPN.
        if (q < 2 || q == 0xffffff || qpns_.count(q) || recent_qpns_.contains(q)) continue;
        qpns_.insert(q);
        return q;
    }
}

bool SharedTables::take_qpn(uint32_t qpn) {
    std::lock_guard<std::mutex> lock(qpn_mutex_);
    return qpns_.insert(qpn).second;
}

void SharedTables::release_qpn(uint32_t qpn) {
    std::lock_guard<std::mutex> lock(qpn_mutex_);
    if (qpns_.erase(qpn)) recent_qpns_.add(qpn);
}

bool SharedTables::qpn_taken(uint32_t qpn) const {
    std::lock_guard<std::mutex> lock(qpn_mutex_);
    return qpns_.count(qpn) != 0;
}

void SharedTables::set_device_ud(uint32_t qpn, uint16_t lid, uint64_t guid) {
    std::lock_guard<std::mutex> lock(device_ud_mutex_);
    device_ud_[qpn] = UdOwner{lid, guid};
}

bool SharedTables::device_ud(uint32_t qpn, uint16_t& lid, uint64_t& guid) const {
    std::lock_guard<std::mutex> lock(device_ud_mutex_);
    auto it = device_ud_.find(qpn);
    if (it == device_ud_.end()) return false;
    lid = it->second.lid;
    guid = it->second.guid;
    return true;
}

}  // namespace vrdma::shim
