// One message of the transport layer as the responder sees it, whatever
// carried it (the local transport, or a frame from a peer shim), and the
// responder's answer. This is the seam between the requester (the sender's
// QP: ordering, timers, retries, send completions) and the responder (the
// target QP: state, receive queue, keys, atomics, receive completions), as
// in rxe. docs/protocol.md ("Transports") describes the semantics.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace vrdma::shim {

struct SendWork;

// vrdma's own requests, outside enum ibv_wr_opcode: what an RC QP on a TM
// SRQ sends by itself for a rendezvous it matched from a sender on another
// worker or shim (tag_matching.h), as a device's QP would. Neither takes a
// PSN of the QP's sequence: `psn` names the rendezvous' piece, and the
// answer (Response::tm) goes to the rendezvous, not to the requester.
//   kTmRndvRead  reads `length` bytes at remote_addr with rkey, as an RDMA
//                READ of the receiving QP would (at most TurnScheduler::kSliceBytes
//                a request);
//   kTmRndvFin   the FIN into the sending QP's next receive: the
//                rendezvous' TMH and RVH travel in sgid and dgid.
constexpr uint32_t kTmRndvRead = 0x100;
constexpr uint32_t kTmRndvFin = 0x101;
constexpr bool is_tm_request(uint32_t op) { return op == kTmRndvRead || op == kTmRndvFin; }

// The ibv_wr_opcode values a guest's WQE may send as a Request.
constexpr bool is_verbs_request_opcode(uint32_t op) {
    switch (op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_SEND_WITH_INV:  // RC only; the rkey to invalidate travels in rkey
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_WRITE:  // its 8 bytes travel in compare_add, not as payload
        return true;
    default:
        return false;
    }
}

// The opcodes a Request may carry: those, and vrdma's own (never a guest's).
constexpr bool is_request_opcode(uint32_t op) { return is_verbs_request_opcode(op) || is_tm_request(op); }

// The requests whose payload goes from the requester to the responder.
constexpr bool request_carries_payload(uint32_t op) {
    return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV || op == IBV_WR_RDMA_WRITE ||
           op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

// The requests whose answer brings the responder's data back.
constexpr bool request_reads(uint32_t op) { return op == IBV_WR_RDMA_READ || op == kTmRndvRead; }

// Every field is plain data: a frame from a peer shim is decoded into one
// of these and validated by the responder exactly like a local request.
struct Request {
    uint32_t opcode = 0;       // enum ibv_wr_opcode
    uint32_t qp_type = 0;      // IBV_QPT_RC, IBV_QPT_UC or IBV_QPT_UD
    uint32_t psn = 0;          // RC, UC: one PSN per message (24 bits)
    uint16_t slid = 0;         // source (LID, QPN)
    uint16_t dlid = 0;         // destination (LID, QPN)
    uint32_t sqpn = 0;
    uint32_t dqpn = 0;
    // RC and UC: the sending QP's incarnation and the one it is bound to
    // (0: not yet known, a peer on another shim before its first answer).
    // The responder accepts only the incarnation its QP is bound to
    // (docs/protocol.md "Fabric": connections bind incarnations).
    uint64_t src_incarnation = 0;
    uint64_t dst_incarnation = 0;
    // The P_Key at the sending QP's pkey_index: the responder drops a
    // request from outside the target QP's partition.
    uint16_t pkey = 0xffff;
    uint8_t sl = 0;
    bool solicited = false;
    bool has_imm = false;
    uint32_t imm = 0;          // network byte order, as in ibv_send_wr
    uint64_t length = 0;       // payload (SEND, WRITE), bytes to read (READ), 8 (atomics)
    uint32_t rkey = 0;         // RDMA and atomics; SEND_WITH_INV: the rkey to invalidate
    uint64_t remote_addr = 0;
    uint64_t compare_add = 0;  // atomics; ATOMIC_WRITE: the value stored
    uint64_t swap = 0;
    // RC from an XRC_SEND QP: the XRC SRQ the message is for (its number;
    // 0: not XRC). The target is an XRC_RECV QP of that SRQ's domain.
    uint32_t xrc_srqn = 0;
    // UD only.
    uint32_t qkey = 0;
    bool grh = false;          // the sender's address handle is global
    uint8_t traffic_class = 0;
    uint8_t hop_limit = 0;
    uint32_t flow_label = 0;
    uint8_t sgid[16] = {};
    uint8_t dgid[16] = {};
    // Not carried: the payload is the WQE's inline data (in the requester's
    // scratch memory, valid only while the transport's send() runs).
    bool inline_payload = false;
    // Not carried: this PSN was sent before (a resend after a timeout or a
    // NAK); transports count them.
    bool resend = false;
    // Not carried: a member's copy of a multicast datagram, its payload in
    // the shim's memory (multicast_delivery.h): nobody waits for an answer.
    bool fan_out = false;
    // Not carried: the guest's WQE, validated, for a transport that posts
    // it as it is (hca_transport.h).
    const SendWork* wqe = nullptr;
    // Not carried: the WQE's send queue index. A UD or UC request that a
    // transport sends later (the fabric) completes when the transport says
    // its payload left the guest's memory (requester_sent).
    uint32_t sq_idx = 0;
};

// The responder's answer to an RC request (UD and UC requests get none:
// the local transport computes one, and the requester ignores it).
enum class Syndrome : uint8_t {
    Ack = 0,        // executed; READ data or the atomic's original value follow
    RnrNak = 1,     // no receive posted: retry after rnr_timer
    NakSeq = 2,     // PSN out of sequence: resend from `psn` (the responder's expected PSN)
    NakInvReq = 3,  // invalid request (length, alignment, opcode): IBV_WC_REM_INV_REQ_ERR
    NakAccess = 4,  // rkey, range or access: IBV_WC_REM_ACCESS_ERR
    NakOp = 5,      // the responder failed (bad receive WQE): IBV_WC_REM_OP_ERR
    Drop = 6,       // silently discarded (no such QP, not connected to the sender, not
                    // ready, port down): the requester's timer decides
    LocalFault = 7, // the requester's own memory lost a page while the payload moved
                    // (fault_guard.h): IBV_WC_LOC_PROT_ERR. On the fabric: the answer to
                    // a request its sender's shim aborted for that reason
};
constexpr uint8_t kSyndromeMax = 7;  // the last syndrome a peer may send

struct Response {
    Syndrome syndrome = Syndrome::Drop;
    uint8_t rnr_timer = 0;      // RnrNak: the responder's min_rnr_timer (IB encoding)
    uint32_t psn = 0;           // the request's PSN (NakSeq: the expected one)
    uint64_t atomic_orig = 0;   // Ack of an atomic
    // The responding QP's incarnation (0 with Drop): a requester on another
    // shim binds its connection to it on the first answer.
    uint64_t incarnation = 0;
    // The answer to a kTmRndvRead or kTmRndvFin (request.h): for the
    // rendezvous of the QP it goes to (tag_matching.h), not its requester.
    bool tm = false;
};

}  // namespace vrdma::shim
