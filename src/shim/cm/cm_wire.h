// The CM messages between two ids (docs/protocol.md "rdma_cm"): what the
// IB CM's MADs carry, in the shim's own fixed layout. Between ids of one
// shim a message is handed over in place; to a guest of a peer shim it
// travels in a fabric segment (SegType::Cm) to the peer's connection
// manager, which validates it like any input from a peer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vrdma::shim::cm {

enum class CmOp : uint8_t {
    Req = 1,       // connect: the active side's id, QP and private data
    Rep = 2,       // accept: the passive side's
    Rtu = 3,       // the active side's QP is ready: the connection is established
    Rej = 4,       // a request refused (or withdrawn, or dropped: `unreachable`)
    Dreq = 5,      // disconnect
    Drep = 6,      // the answer to a disconnect
    SidrReq = 7,   // UD: where is the service on this port?
    SidrRep = 8,   // UD: here (QPN, Q_Key), or refused (`status`)
    Addresses = 9, // CmAddressMsg: a guest's addresses (none: the guest is gone)
};
constexpr uint8_t kCmOpLast = uint8_t(CmOp::Addresses);

// One message of the exchange. Integers little-endian; addresses and ports
// in network order as in a sockaddr.
struct CmMsg {
    uint8_t op;          // CmOp
    uint8_t qp_type;     // of the sending id
    uint16_t ps;         // its port space
    uint16_t src_lid;    // the sending id's guest
    uint16_t dst_lid;    // the receiving id's guest
    uint32_t src_id;     // the sending id (its shim's handle)
    uint32_t dst_id;     // the receiving id (0: not known yet, as for a Req)
    uint32_t qp_num;
    uint32_t psn;
    uint32_t qkey;
    int32_t status;      // Rej: the reason; SidrRep: the SIDR status
    uint8_t responder_resources;
    uint8_t initiator_depth;
    uint8_t retry_count;
    uint8_t rnr_retry_count;
    uint8_t srq;
    uint8_t private_data_len;
    uint8_t family;      // AF_INET or AF_INET6 (Req, SidrReq)
    uint8_t unreachable; // Rej: the request was dropped (a full backlog)
    uint16_t src_port;   // Req, SidrReq: the active side's address and the one it connects to
    uint16_t dst_port;
    uint8_t src_ip[16];
    uint8_t dst_ip[16];
    uint32_t ece_vendor;
    uint32_t ece_attr;
    uint8_t private_data[256];
};
static_assert(sizeof(CmMsg) == 340);

// A guest's addresses, from the shim that serves it.
struct CmAddressMsg {
    uint8_t op;      // CmOp::Addresses
    uint8_t count;   // 0 to 16 (0: the guest is gone)
    uint16_t lid;
    uint16_t pkey;
    uint16_t reserved;
    uint64_t guid;
    struct {
        uint8_t family;
        uint8_t reserved[3];
        uint8_t ip[16];
    } addrs[16];
};
static_assert(sizeof(CmAddressMsg) == 16 + 16 * 20);

constexpr size_t kMaxCmWire = sizeof(CmMsg) > sizeof(CmAddressMsg) ? sizeof(CmMsg) : sizeof(CmAddressMsg);

}  // namespace vrdma::shim::cm
