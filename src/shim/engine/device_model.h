// What a guest's vrdma0 looks like: identity (LID, GUIDs, GID) and the limits
// the shim advertises. The limits are the ones it enforces: QueryDevice,
// QueryPort and the sysfs tree are all filled from here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "guest_load.h"
#include "guest_security.h"

#include "vrdma/abi.h"

namespace vrdma::shim {

// Per-guest resource limits (every context of a guest together; quota.h).
// Device attributes report these, and command handlers enforce them (ENOMEM
// once a count is reached). `vrdma-shim --quota KEY=VALUE` sets them.
struct Quotas {
    uint32_t max_qp = 16384;
    uint32_t max_qp_wr = 16384;
    uint32_t max_sge = abi::kMaxSge;
    uint32_t max_cq = 16384;
    uint32_t max_cqe = abi::kMaxCqEntries - 1;  // the provider rounds cqe+1 up to a power of two
    uint32_t max_mr = 1u << 18;
    uint32_t max_mw = 1u << 18;
    uint64_t max_mr_size = 1ull << 40;
    uint32_t max_pd = 1u << 16;
    uint32_t max_ah = 1u << 16;
    uint32_t max_srq = 8192;
    uint32_t max_srq_wr = 16384;
    uint32_t max_inline = abi::kMaxInline;
    uint32_t max_rd_atomic = 16;
    // Not device attributes: what a guest may make the shim hold.
    uint32_t max_connections = 256;        // open sockets (each attached one: a context)
    uint64_t max_mr_bytes = 1ull << 40;    // registered memory, sum of MR lengths
    uint64_t max_wr = 1u << 22;            // work-queue entries of all QPs and SRQs
    uint64_t max_mappings = 16384;         // mmap()s (segments, multi-segment MRs)
    uint64_t max_map_bytes = 2ull << 40;   // bytes of guest memory mapped
    // File descriptors the shim holds for the guest: sockets, each context's
    // eventfds and async pipe, completion channels. 0: no limit (tests); the
    // shim sets a share of its RLIMIT_NOFILE (default_fd_share).
    uint64_t max_fds = 0;
};

// Identity of the device. vendor_id 0xFFFFFF is the value IBTA leaves to a
// vendor without an IEEE OUI; Soft-RoCE (rxe) reports it for its software
// device too, and vrdma, having no OUI of its own, does the same rather
// than borrow another vendor's. vendor_part_id tells vrdma apart within
// it (rxe leaves it 0): ASCII "vr". hw_ver is the version of the device
// ABI the guest speaks (abi::kVersion); fw_ver is the shim's release
// (the CMake project version), also published as sysfs fw_ver.
constexpr uint32_t kVendorId = 0xffffff;
constexpr uint32_t kVendorPartId = 0x7672;
constexpr uint32_t kHwVersion = abi::kVersion;
#ifndef VRDMA_VERSION
#error "VRDMA_VERSION (the CMake project version) must be defined"
#endif
constexpr const char* kFwVersion = VRDMA_VERSION;

constexpr uint32_t kPortMtuBytes = 4096;  // IBV_MTU_4096
constexpr uint32_t kMaxPkeys = 16;        // P_Key table entries a guest may be given
// The GID table: index 0 is the port's GID; the others are empty, as on an
// IB HCA's port (a query of one answers ENODATA), and no AH or QP may name
// them.
constexpr uint32_t kGidTableLen = 8;

// Two P_Keys admit traffic between their QPs when they name the same
// partition (low 15 bits) and at least one of them is a full member (bit 15).
constexpr bool pkeys_match(uint16_t a, uint16_t b) { return (a & 0x7fff) == (b & 0x7fff) && ((a | b) & 0x8000); }
constexpr uint32_t kMaxMsgSize = 1u << 31;

// The largest weight: a turn of at most 16 budgets (about 160 us of the
// worker's time) before its other guests are served again.
inline constexpr uint32_t kMaxGuestWeight = 16;

struct GuestIdentity {
    std::string name;
    uint16_t lid = 0;
    uint64_t guid = 0;  // host byte order; node GUID = port GUID = sys image GUID
    // Port 1 is ACTIVE, or DOWN (Disabled) after the operator took it down
    // (vrdmactl port NAME down): then nothing reaches or leaves the guest.
    bool port_active = true;
    // The guest may give its UD QPs a controlled qkey (the high bit set),
    // which IB reserves to privileged consumers (vrdma-shim --guest
    // NAME:controlled-qkeys). Otherwise ModifyQp refuses one with EPERM.
    bool controlled_qkeys = false;
    // The P_Key table of port 1 (vrdma-shim --guest NAME:pkeys=...): the
    // partitions the guest is in, bit 15 set for full membership. Default:
    // the default partition, full member.
    std::vector<uint16_t> pkeys = {0xffff};
    // Its share of its worker beside the worker's other guests: a budget of
    // weight times TurnScheduler::kTurnBudget per pass (vrdma-shim --guest
    // NAME:weight=W, 1 to kMaxGuestWeight; default 1, equal shares).
    uint32_t weight = 1;
    // Removed at run time (vrdmactl guest remove): it has no contexts and
    // no route, and its LID may serve another guest. The identity stays, as
    // objects of the guest's last moments may still name it.
    bool removed = false;
    GuestSecurity security;  // counted by the engine (responder) and the daemon (accept)
    mutable GuestLoad load;  // statistics the engine counts as it serves the guest (guest_load.h)
};

// A 64-bit id of this host (hash of /etc/machine-id, or of the hostname).
uint64_t host_id();
// Deterministic, nonzero GUID for a guest of this host.
uint64_t derive_guid(uint64_t host, const std::string& guest_name);

// GID 0: fe80::/64 followed by the port GUID (network byte order).
void make_gid(uint64_t guid, uint8_t gid[16]);

// "xxxx:xxxx:xxxx:xxxx"
std::string format_guid(uint64_t guid);
// "fe80:0000:0000:0000:xxxx:xxxx:xxxx:xxxx"
std::string format_gid(const uint8_t gid[16]);

abi::DeviceAttr make_device_attr(const GuestIdentity& id, const Quotas& q);
abi::PortAttr make_port_attr(const GuestIdentity& id);

}  // namespace vrdma::shim
