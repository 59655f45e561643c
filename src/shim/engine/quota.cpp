#include "quota.h"

#include <cerrno>
#include <cstdlib>

#include "device_model.h"
#include "engine.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

struct Key {
    Res res;
    const char* name;
};
constexpr Key kKeys[] = {
    {Res::Connections, "connections"}, {Res::Pd, "pd"},   {Res::Mr, "mr"},   {Res::Mw, "mw"}, {Res::MrBytes, "mr_bytes"},
    {Res::Cq, "cq"},                   {Res::Qp, "qp"},   {Res::Srq, "srq"}, {Res::Ah, "ah"},
    {Res::Wr, "wr"},                   {Res::Mappings, "mappings"},          {Res::MapBytes, "map_bytes"},
    {Res::Fds, "fds"},
};
static_assert(sizeof(kKeys) / sizeof(kKeys[0]) == kResCount);

constexpr uint64_t kLogIntervalNs = 1'000'000'000;


}  // namespace

bool parse_size(const std::string& s, uint64_t& out) {
    if (s.empty() || s[0] == '-') return false;
    char* end;
    errno = 0;
    unsigned long long v = std::strtoull(s.c_str(), &end, 0);
    if (errno || end == s.c_str()) return false;
    unsigned shift = 0;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        case 't': case 'T': shift = 40; break;
        default: return false;
        }
        if (end[1]) return false;
    }
    if (shift && v > (~0ull >> shift)) return false;
    out = v << shift;
    return true;
}

const char* res_key(Res r) {
    for (const Key& k : kKeys)
        if (k.res == r) return k.name;
    return "?";
}

uint64_t default_fd_share(uint64_t nofile_limit, size_t guests) {
    if (guests == 0) guests = 1;
    const uint64_t reserve = 64 + 8 * uint64_t(guests);
    const uint64_t share = nofile_limit > reserve ? (nofile_limit - reserve) / guests : 0;
    return share > 8 ? share : 8;  // a guest needs at least one attached context
}

uint64_t quota_limit(const Quotas& q, Res r) {
    switch (r) {
    case Res::Connections: return q.max_connections;
    case Res::Pd: return q.max_pd;
    case Res::Mr: return q.max_mr;
    case Res::Mw: return q.max_mw;
    case Res::MrBytes: return q.max_mr_bytes;
    case Res::Cq: return q.max_cq;
    case Res::Qp: return q.max_qp;
    case Res::Srq: return q.max_srq;
    case Res::Ah: return q.max_ah;
    case Res::Wr: return q.max_wr;
    case Res::Mappings: return q.max_mappings;
    case Res::MapBytes: return q.max_map_bytes;
    case Res::Fds: return q.max_fds ? q.max_fds : UINT64_MAX;
    case Res::kCount: break;
    }
    return 0;
}

bool set_quota(Quotas& q, const std::string& kv, std::string& error) {
    auto eq = kv.find('=');
    std::string key = kv.substr(0, eq);
    uint64_t v = 0;
    if (eq == std::string::npos || !parse_size(kv.substr(eq + 1), v)) {
        error = "--quota needs KEY=VALUE with a number (suffix k, M, G or T allowed), not '" + kv + "'";
        return false;
    }
    auto u32 = [&](uint32_t& f) {
        if (v > 0xffffffffu) return false;
        f = uint32_t(v);
        return true;
    };
    bool ok = true;
    if (key == "connections") ok = u32(q.max_connections);
    else if (key == "pd") ok = u32(q.max_pd);
    else if (key == "mr") ok = u32(q.max_mr);
    else if (key == "mw") ok = u32(q.max_mw);
    else if (key == "mr_bytes") q.max_mr_bytes = v;
    else if (key == "cq") ok = u32(q.max_cq);
    else if (key == "qp") ok = u32(q.max_qp);
    else if (key == "srq") ok = u32(q.max_srq);
    else if (key == "ah") ok = u32(q.max_ah);
    else if (key == "wr") q.max_wr = v;
    else if (key == "mappings") q.max_mappings = v;
    else if (key == "map_bytes") q.max_map_bytes = v;
    else if (key == "fds") q.max_fds = v ? v : 1;
    else {
        error = "unknown --quota key '" + key +
                "' (connections, pd, mr, mr_bytes, cq, qp, srq, ah, wr, mappings, map_bytes, fds)";
        return false;
    }
    if (!ok) {
        error = "--quota " + key + " must be below 2^32";
        return false;
    }
    return true;
}

namespace {

// Reserves n of the shim-wide mappings; false if that would pass the limit.
bool take_global_mappings(GlobalUsage& g, uint64_t n) {
    uint64_t cur = g.mappings.load(std::memory_order_relaxed);
    do {
        if (g.mapping_limit && (n > g.mapping_limit || cur > g.mapping_limit - n)) return false;
    } while (!g.mappings.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
    return true;
}

void give_global_mappings(GlobalUsage& g, uint64_t n) {
    uint64_t cur = g.mappings.load(std::memory_order_relaxed);
    while (!g.mappings.compare_exchange_weak(cur, n <= cur ? cur - n : 0, std::memory_order_relaxed)) {
    }
}

}  // namespace

bool GuestUsage::take(Res r, uint64_t n, const char* what) {
    const unsigned i = unsigned(r);
    const uint64_t lim = limit(r);
    const bool over = n > lim || used_[i] > lim - n;
    const bool global_full = !over && r == Res::Mappings && !take_global_mappings(*global_, n);
    if (over || global_full) {
        ++refusals_;
        uint64_t t = monotonic_ns();
        if (t - last_log_ns_[i] >= kLogIntervalNs || last_log_ns_[i] == 0) {
            if (global_full)
                LOG_WARN("guest %s: %s refused: the shim holds %llu of at most %llu mappings for all guests "
                         "(%llu similar refusals not logged)",
                         guest_.c_str(), what, (unsigned long long)global_->mappings.load(),
                         (unsigned long long)global_->mapping_limit, (unsigned long long)suppressed_[i]);
            else
                LOG_WARN("guest %s: %s refused: over quota %s=%llu (%llu in use, %llu asked; "
                         "%llu similar refusals not logged)",
                         guest_.c_str(), what, res_key(r), (unsigned long long)lim, (unsigned long long)used_[i],
                         (unsigned long long)n, (unsigned long long)suppressed_[i]);
            last_log_ns_[i] = t;
            suppressed_[i] = 0;
        } else {
            ++suppressed_[i];
        }
        return false;
    }
    used_[i] += n;
    return true;
}

void GuestUsage::give(Res r, uint64_t n) {
    const unsigned i = unsigned(r);
    used_[i] -= n <= used_[i] ? n : used_[i];
    if (r == Res::Mappings) give_global_mappings(*global_, n);
}

bool Charges::take(Res r, uint64_t n, const char* what) {
    if (usage_ && !usage_->take(r, n, what)) return false;
    held_[unsigned(r)] += n;
    return true;
}

void Charges::give(Res r, uint64_t n) {
    uint64_t& h = held_[unsigned(r)];
    if (n > h) n = h;
    h -= n;
    if (usage_) usage_->give(r, n);
}

void Charges::release_all() {
    for (unsigned i = 0; i < kResCount; ++i)
        if (held_[i]) give(Res(i), held_[i]);
}

void Charges::absorb(Charges& other) {
    for (unsigned i = 0; i < kResCount; ++i) {
        held_[i] += other.held_[i];
        other.held_[i] = 0;
    }
}

}  // namespace vrdma::shim
