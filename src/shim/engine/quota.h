// Per-guest quotas: what every context of one guest may make the shim hold,
// together. A guest is a tenant; it may open any number of contexts (one per
// process, several per process), so per-context limits alone would not bound
// it. Each resource a command or a socket message would create is charged to
// the guest first; a charge over the limit is refused (ENOMEM, as the kernel's
// verbs do when a resource table or the pinned-memory limit is exhausted) and
// logged, rate-limited, at the shim.
//
// Charges live as long as what they pay for: a context gives back its
// resources' charges when it is destroyed, a Mapping its own when it is
// unmapped (see segment_table.h), a connection its own when it is closed.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace vrdma::shim {

struct Quotas;

enum class Res : uint8_t {
    Connections,  // sockets open to the guest's shim socket (attached or not)
    Pd,
    Mr,
    Mw,
    MrBytes,      // sum of MR lengths ("registered memory")
    Cq,
    Qp,
    Srq,
    Ah,
    Wr,           // work-queue entries: SQ + RQ depths of QPs, SRQ depths ("outstanding work")
    Mappings,     // mmap()s the shim holds for the guest (segments; MR composites: 1 + pieces)
    MapBytes,     // bytes of guest memory the shim maps (segments and MR composites)
    Fds,          // fds the shim holds: sockets (1), contexts (3: eventfds, async pipe), channels (1)
    kCount
};
constexpr unsigned kResCount = unsigned(Res::kCount);

// A size as the operator writes it: decimal or 0x hex, optional k/M/G/T
// suffix (powers of 1024). False for anything else, or past 64 bits.
bool parse_size(const std::string& s, uint64_t& out);
// The --quota KEY of a resource ("qp", "mr_bytes", ...).
const char* res_key(Res r);
// Reads KEY=VALUE (VALUE: decimal or 0x hex, optional k/M/G/T suffix, powers
// of 1024) into `q`. False with a message on an unknown key or a bad value.
bool set_quota(Quotas& q, const std::string& key_value, std::string& error);
uint64_t quota_limit(const Quotas& q, Res r);
// The fds quota when the operator gives none: an equal share, per guest, of
// the shim's fd limit less a reserve for the shim itself (listeners, the
// control socket, the fabric, spare fds). Every guest can then always
// attach, whatever the others hold.
uint64_t default_fd_share(uint64_t nofile_limit, size_t guests);

// Shim-wide mappings (the kernel's vm.max_map_count is per process: guests
// together must leave room for the shim's own allocations). Guests served
// by different workers charge it at once: the count is atomic.
struct GlobalUsage {
    std::atomic<uint64_t> mappings{0};
    uint64_t mapping_limit = 0;  // set before any worker runs
};

class GuestUsage {
public:
    GuestUsage(std::string guest, const Quotas& q, GlobalUsage& global)
        : guest_(std::move(guest)), q_(&q), global_(&global) {}
    GuestUsage(const GuestUsage&) = delete;
    GuestUsage& operator=(const GuestUsage&) = delete;

    // Charges n units of r. False (and a log line naming `what`) if that
    // would pass the guest's quota, or for Mappings the shim-wide limit.
    bool take(Res r, uint64_t n, const char* what);
    void give(Res r, uint64_t n);
    uint64_t used(Res r) const { return used_[unsigned(r)]; }
    uint64_t limit(Res r) const { return quota_limit(*q_, r); }
    const std::string& guest() const { return guest_; }
    uint64_t refusals() const { return refusals_; }

private:
    std::string guest_;
    const Quotas* q_;
    GlobalUsage* global_;
    uint64_t used_[kResCount] = {};
    uint64_t last_log_ns_[kResCount] = {};
    uint64_t suppressed_[kResCount] = {};
    uint64_t refusals_ = 0;
};

// What one context (or one mapping) has charged, so that it can give all of
// it back at once. Not copyable: it owns its charges.
class Charges {
public:
    Charges() = default;
    explicit Charges(GuestUsage* usage) : usage_(usage) {}
    Charges(const Charges&) = delete;
    Charges& operator=(const Charges&) = delete;
    ~Charges() { release_all(); }

    void bind(GuestUsage* usage) { usage_ = usage; }
    GuestUsage* usage() const { return usage_; }
    // No usage bound (tests building objects by hand): always succeeds.
    bool take(Res r, uint64_t n, const char* what);
    void give(Res r, uint64_t n);
    void release_all();
    // Moves every charge of `other` into this one.
    void absorb(Charges& other);

private:
    GuestUsage* usage_ = nullptr;
    uint64_t held_[kResCount] = {};
};

}  // namespace vrdma::shim
