// The responder: everything the target QP's side of the IB transport does
// with one request, whatever transport carried it. It checks the QP's state
// and connection, the PSN, consumes a receive WQE (QP or SRQ) or decides an
// RNR NAK, checks rkeys, ranges and access, executes atomics, writes the
// receive completion and moves the QP to error when the protocol says so.
//
// It works in two steps so that a transport can move the payload between
// them at its own pace (the local transport: one memcpy; tcp: socket reads
// straight into the target memory, over several turns):
//   responder_begin  decides, before any payload byte moves, and says where
//                    the payload goes (SEND, WRITE) or comes from (READ):
//                    a state machine of one step per check (responder.cpp);
//   responder_end    finishes the request however its payload ended.
#pragma once

#include <cstdint>
#include <memory>

#include "context.h"
#include "request.h"
#include "resources.h"
#include "work_queue.h"

namespace vrdma::shim {

class Engine;

struct Delivery {
    Response resp;
    uint32_t opcode = 0;
    // SEND and WRITE: where the payload goes, after `skip` bytes (the GRH
    // room of a UD receive). READ: where the data comes from.
    Span spans[abi::kMaxSge];
    uint32_t nspans = 0;
    uint64_t skip = 0;
    uint64_t length = 0;

    // The receive completion responder_finish writes (SEND, WRITE with
    // immediate). ctx/qp are valid until control returns to the engine;
    // an asynchronous transport calls responder_revalidate first.
    bool recv_cqe = false;
    Context* ctx = nullptr;
    Qp* qp = nullptr;
    uint64_t ctx_id = 0;
    uint32_t qp_handle = 0;
    uint32_t qpn = 0;
    uint32_t recv_cq = 0;  // the QP's, or the XRC SRQ's the request named
    abi::Cqe cqe{};
    bool solicited = false;
    // A message to a TM SRQ: it lands in the QP's staging buffer and
    // responder_finish hands it to tag_matching.h.
    bool tm = false;
    Engine* eng = nullptr;
    uint64_t incarnation = 0;  // the QP's when it was staged (a reset QP is another)

    // Ready for another request: every field but the scatter list, whose
    // first `nspans` entries alone mean anything (clearing all of it per
    // message was a measurable part of a 64-byte write's cost).
    void reset() {
        resp = Response{};
        opcode = 0;
        nspans = 0;
        skip = length = 0;
        recv_cqe = false;
        ctx = nullptr;
        qp = nullptr;
        ctx_id = 0;
        qp_handle = 0;
        qpn = 0;
        recv_cq = 0;
        cqe = abi::Cqe{};
        solicited = false;
        tm = false;
        eng = nullptr;
        incarnation = 0;
    }
};

// Decides what happens to `req`. `pins` (null for a synchronous transport)
// receives the mappings of every span.
void responder_begin(Engine& eng, const Request& req, Delivery& d, Pins* pins = nullptr);

// Finds the target QP of `d` again after the engine ran (it may have been
// destroyed or reset meanwhile: then false and nothing is to be written).
bool responder_revalidate(Engine& eng, Delivery& d);

// A transfer that arrives in slices, before each slice after the first:
// false when its target QP went away or into error meanwhile. Then the
// rest is lost: the receive (if any) completes flushed, and d.resp drops
// request `psn` (the requester's retries find nobody: RETRY_EXC_ERR). One
// rule for every transport that delivers in slices.
bool responder_still_there(Engine& eng, Delivery& d, uint32_t psn);

// Writes the receive completion, if any. `payload_ok` false: the payload
// never arrived whole (the peer shim went away): the receive completes with
// IBV_WC_REM_ABORT_ERR and the QP goes to error.
void responder_finish(Delivery& d, bool payload_ok = true);

// The responder's memory lost a page while the payload moved (the guest
// truncated the file behind its MR): the requester gets NakAccess
// (IBV_WC_REM_ACCESS_ERR), a receive completes with IBV_WC_LOC_PROT_ERR and
// an RC QP goes to error with IBV_EVENT_QP_ACCESS_ERR.
void responder_memory_fault(Delivery& d);

// How the payload of a request that began (responder_begin) ended.
enum class PayloadEnd {
    Moved,           // all of it: the receive completes
    Lost,            // it never arrived whole (the requester gave the transfer up, or
                     // the connection that carried it closed): the receive, if any,
                     // completes with IBV_WC_REM_ABORT_ERR, and an RC QP goes to error
                     // even without one (a partial RDMA WRITE: the responder counted
                     // the request as executed, so a resend would be acknowledged as
                     // a duplicate with only part of the data written)
    RequesterFault,  // the requester's memory lost a page under the move: the
                     // requester gets LocalFault (IBV_WC_LOC_PROT_ERR there); an RC
                     // receive completes as Lost, a UD or UC one with
                     // IBV_WC_LOC_PROT_ERR
    ResponderFault,  // this responder's memory lost a page: responder_memory_fault
};
// The one end of every request's payload, whatever transport carried it.
// A transport whose engine ran since responder_begin calls
// responder_revalidate first (a target that went away is then not touched,
// and only d.resp is set).
void responder_end(Delivery& d, PayloadEnd how);

// The 40-byte GRH written in front of a UD payload from a global address.
void make_grh(const Request& req, uint8_t out40[40]);

}  // namespace vrdma::shim
