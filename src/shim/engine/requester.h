// The requester: the sender's side of the IB transport for one QP. It owns
// the send queue: it reads each WQE (copied out, validated), resolves the
// sender's memory, builds the Request and hands it to the transport bound to
// the QP; it keeps the WQEs in flight in order, completes them as responses
// arrive (ACK: success; NAK: the error; RNR NAK: wait the responder's timer
// and send again; a lost request: the QP's timeout, retry_cnt times, then
// IBV_WC_RETRY_EXC_ERR), and flushes the queue when the QP is in error.
//
// PSNs: one per message. A request lost or refused is sent again from the
// oldest unacknowledged WQE (go-back-N); the responder answers duplicates
// without executing them twice (responder.h).
#pragma once

#include <cstdint>

#include "context.h"
#include "request.h"
#include "resources.h"
#include "work_queue.h"

namespace vrdma::shim {

class Engine;
class Transport;
struct Pins;

// One pass over the QP's send queue (and receive queue when flushing).
// Returns true if anything progressed.
// At most `max_wqes` new WQEs start (send_posted_datagrams).
// noinline: scripts/bench-instructions.sh counts it by name.
[[gnu::noinline]] bool requester_process(Engine& eng, Context& ctx, Qp& qp, uint64_t now,
                                         uint32_t max_wqes = UINT32_MAX);

// A UD QP's datagrams that were posted and not yet taken leave now,
// whatever the turn's budget, as many as `allowance` says (it goes down by
// those that went; what they cost comes off the guest's next turns, as any
// overrun does): called before an AH or the QP itself is destroyed, with
// kPostedDatagrams for the command (commands run before the queues in a
// pass, and a turn spent would leave them). A device would have sent them
// by then, and programs rely on it: mckey posts its last sends, then
// destroys the AH and the QP without waiting for completions.
constexpr uint32_t kPostedDatagrams = 64;
void send_posted_datagrams(Engine& eng, Context& ctx, Qp& qp, uint32_t& allowance);

// The response of an asynchronous transport to the request `resp.psn` of an
// RC QP. Stale responses (not for the oldest WQE in flight) are ignored.
void requester_on_response(Engine& eng, Context& ctx, Qp& qp, const Response& resp);

// The device completed the WQE at ring index `idx` of a QP bound to it
// (hca_completions.h) with `status` (enum ibv_wc_status).
void requester_carried_done(Engine& eng, Context& ctx, Qp& qp, uint32_t idx, uint32_t status);
// A UD or UC request a transport took for later (SendResult::InFlight over
// the fabric) is sent: its payload is out of the guest's memory, and its
// WQE (send queue index `idx`, which must be the head) completes, so the
// guest may reuse the buffer only once nothing reads it any more.
void requester_sent(Engine& eng, Context& ctx, Qp& qp, uint32_t idx);

// The READ in flight with `psn` cannot take its data (its memory is gone):
// it completes with `status` and the QP goes to error.
void requester_local_error(Engine& eng, Context& ctx, Qp& qp, uint32_t psn, uint32_t status);

// Where the data of the RDMA READ in flight with `psn` goes: the WQE's
// scatter list resolved again (an asynchronous transport reads the response
// payload straight into it). IBV_WC_SUCCESS or the local error status.
uint32_t requester_read_target(Engine& eng, Context& ctx, Qp& qp, uint32_t psn, Span* out, uint32_t& spans,
                               uint64_t& len, Pins* pins);

// QP state changes (cmd_qp.cpp): RTS starts the PSNs and retry budgets;
// RESET forgets everything in flight; SQD lets the WQEs started so far
// finish.
void requester_start(Qp& qp);
void requester_reset(Qp& qp);
void requester_begin_drain(Qp& qp);

// For requests the shim makes for an RC QP by itself (tag_matching.h): the
// transport its traffic takes now (null: none), and a request's source
// (LID, QPN, P_Key, incarnations).
Transport* requester_route(Engine& eng, Qp& qp);
void requester_stamp(const Context& ctx, const Qp& qp, Request& req);

// Maps an ibv_wr_opcode to the ibv_wc_opcode of its completion.
uint32_t wc_opcode_for(uint32_t wr_opcode);

}  // namespace vrdma::shim
