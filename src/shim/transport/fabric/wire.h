// The fabric protocol between shims over TCP (docs/protocol.md "Fabric").
//
// A connection starts with a TLS 1.3 handshake (tls_channel.h: the fabric
// key as pre-shared key). Everything after it goes through the channel:
// first a Hello each way, then a sequence of segments: a SegHeader, then
// `fixed_len` bytes of fixed part (the first segment of a message: its
// encoded Request or Response), then `payload_len` bytes of payload. A
// message's payload may be cut into several segments (at most
// kMaxSegmentPayload each) so that small messages of other QPs are not
// stuck behind a large one; the segments of one QP's messages are never
// reordered. Integers are little-endian (fixed-width structs, checked at
// compile time; every host of a fabric is x86-64 or another little-endian
// machine).
//
// Everything read from a peer is validated like guest input.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "request.h"

namespace vrdma::shim::fabric {

constexpr uint32_t kHelloMagic = 0x46524d56;  // "VMRF"
// 2: incarnations and the P_Key in requests; 3: device GIDs; 4: UD QPs on
// devices; 5: TLS 1.3, the Hello inside it, 128-bit instance ids, the mode,
// partition announcements; 6: encrypt mode in AES-GCM frames, keys of both
// modes by generation; 7: workers (a connection joins one worker of each
// shim: the dialer names the one it wants); 8: rdma_cm messages (SegType::Cm);
// 9: multicast (a UD request to a multicast LID, for the receiving worker's
// members of the group); 10: tag-matching rendezvous requests (request.h:
// kTmRndvRead, kTmRndvFin) and kRespTm in responses; 11: the compact
// request (a WireRequest of 48 bytes and extensions; the addresses and the
// PSN only in the segment header)
constexpr uint32_t kProtocolVersion = 11;
constexpr uint32_t kMaxSegmentPayload = 64 * 1024;

// Random per shim start: tells a restarted peer apart, and a connection of
// a shim to itself (both ends compare it).
using InstanceId = std::array<uint8_t, 16>;

// Sent by both ends as the first bytes inside the TLS channel.
struct Hello {
    uint32_t magic;
    uint32_t version;
    uint8_t instance[16];
    uint16_t lid_first;    // the LIDs this shim owns
    uint16_t lid_last;
    uint16_t listen_port;  // where this shim accepts fabric connections (0: nowhere)
    uint8_t crypto_mode;   // CryptoMode (tls_channel.h): both ends must use the same
    uint8_t reserved;
    // The GID of this shim's RDMA device (--hca), all zeros if it has none:
    // guests of two shims with devices talk through them (hca_bind.h).
    uint8_t device_gid[16];
    // A connection joins one worker of each shim (docs/protocol.md
    // "Fabric"): the dialer says which of its workers it is (`worker`) and
    // which of the listener's it wants (`target`); the listener, whose
    // Hello leaves before it read the dialer's, says kAnyWorker to both.
    uint8_t workers;  // how many workers the sending shim runs (1..kMaxFabricWorkers)
    uint8_t worker;
    uint8_t target;
    uint8_t reserved2;
};
static_assert(sizeof(Hello) == 52);
constexpr uint8_t kAnyWorker = 0xff;
constexpr uint32_t kMaxFabricWorkers = 64;

enum class SegType : uint8_t {
    Request = 1,   // requester -> responder shim: fixed part = WireRequest and extensions
    Response = 2,  // responder -> requester shim: fixed part = WireResponse; READ data as payload
    Error = 3,     // a refusal before closing: payload = text
    QpGone = 4,    // the source QP vanished (its process went away): its
                   // connected peer, the destination QP, goes to error
    UdQp = 5,      // the source QP is a UD QP on the sending shim's device,
                   // of the guest whose port GUID is the header's offset
                   // (hca_ud.h: who sent a datagram the device delivered)
    Partitions = 6,  // the P_Key table of the sending shim's guest at the
                     // header's source LID: payload = 1 to kMaxPkeys u16
    Cm = 7,          // a message of the connection manager behind rdma_cm
                     // (src/shim/cm/cm_wire.h), from the guest at the
                     // header's source LID: payload = 1 to kMaxCmPayload bytes,
                     // handed to the peer's CM, which checks it
};
constexpr uint32_t kMaxCmPayload = 512;
constexpr uint32_t kMaxPkeys = 16;

// kSegAbort: only on the last segment of a message (no payload) whose
// payload came from memory its guest may truncate: the sender lost a page
// of it while writing (the bytes in its place were zeros), so the message
// is void. Such messages always end with a segment without payload, so
// that a fault found while writing their last payload bytes can still be
// told (link.cpp).
enum SegFlags : uint8_t { kSegFirst = 1, kSegLast = 2, kSegAbort = 4 };

struct SegHeader {
    uint8_t type;          // SegType
    uint8_t flags;         // kSegFirst | kSegLast
    uint16_t fixed_len;    // 0 unless kSegFirst
    uint32_t payload_len;  // <= kMaxSegmentPayload
    uint16_t src_lid;      // the QP that sent this segment
    uint16_t dst_lid;
    uint32_t src_qpn;
    uint32_t dst_qpn;
    uint32_t psn;
    uint64_t offset;       // of this payload within the message
};
static_assert(sizeof(SegHeader) == 32);

// A request's fixed part: a WireRequest, then the extensions its flags
// name, in this order (docs/protocol.md "Fabric", protocol version 11).
// The request's PSN and its source and destination (LID, QPN) are the
// segment header's; fields an extension would carry are zero without it.
// A 64-byte RDMA WRITE is 32 + 48 + 64 bytes on the wire (it was 32 + 128
// + 64 before version 11: a third of the bytes sealed, sent and opened).
enum ReqFlags : uint8_t {
    kReqSolicited = 1,
    kReqImm = 2,
    kReqGrh = 4,       // the sender's address handle is global
    kReqOperands = 8,  // a WireOperands follows
    kReqAddress = 16,  // a WireAddress follows
};
constexpr uint8_t kReqFlagsKnown = 31;

struct WireRequest {
    uint16_t opcode;   // enum ibv_wr_opcode, or the shim's own (request.h)
    uint8_t qp_type;
    uint8_t flags;     // ReqFlags
    uint16_t pkey;     // the sending QP's P_Key
    uint8_t sl;
    uint8_t reserved;  // 0
    uint32_t imm;
    uint32_t rkey;
    uint32_t qkey;     // UD: the Q_Key; RC from an XRC_SEND QP: the target SRQ
    uint32_t length;   // at most kMaxMsgSize
    uint64_t remote_addr;
    uint64_t src_incarnation;  // RC, UC: the sending QP's incarnation
    uint64_t dst_incarnation;  // and the one it is bound to (0: not yet known)
};
static_assert(sizeof(WireRequest) == 48);

// Atomics and ATOMIC_WRITE.
struct WireOperands {
    uint64_t compare_add;
    uint64_t swap;
};
static_assert(sizeof(WireOperands) == 16);

// A global route (UD with a GRH), or the 32 bytes a rendezvous FIN carries
// in the GIDs' place (request.h kTmRndvFin).
struct WireAddress {
    uint8_t traffic_class;
    uint8_t hop_limit;
    uint16_t reserved;  // 0
    uint32_t flow_label;
    uint8_t sgid[16];
    uint8_t dgid[16];
};
static_assert(sizeof(WireAddress) == 40);

constexpr size_t request_fixed_len(uint8_t flags) {
    return sizeof(WireRequest) + ((flags & kReqOperands) ? sizeof(WireOperands) : 0) +
           ((flags & kReqAddress) ? sizeof(WireAddress) : 0);
}

// WireResponse::flags
enum RespFlags : uint16_t { kRespTm = 1 };  // Response::tm

struct WireResponse {
    uint8_t syndrome;
    uint8_t rnr_timer;
    uint16_t flags;  // RespFlags
    uint32_t psn;
    uint64_t atomic_orig;
    uint64_t length;       // READ: bytes of data that follow as payload
    uint64_t incarnation;  // the responding QP's (0 with Drop)
};
static_assert(sizeof(WireResponse) == 32);

constexpr size_t kMaxFixed = request_fixed_len(kReqOperands | kReqAddress);

// Writes r's fixed part to `out` and returns its length.
uint16_t encode(const Request& r, uint8_t out[kMaxFixed]);
// Decodes the fixed part of a request's first segment `h` (its length was
// checked by header_ok) and checks the encoding itself (enumerations,
// ranges, flags that match the length). False: a malformed request (the
// connection is a protocol violation).
bool decode(const SegHeader& h, const uint8_t* fixed, Request& r);
WireResponse encode(const Response& r, uint64_t length);
bool decode(const WireResponse& w, Response& r, uint64_t& length);

// Checks a segment header against the protocol's limits. `why` gets the
// reason when false.
bool header_ok(const SegHeader& h, const char** why);

}  // namespace vrdma::shim::fabric
