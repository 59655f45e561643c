// The QP state machine of the IB specification (as the kernel's
// ib_modify_qp_is_ok applies it), attribute value checks, and the timers.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "context.h"
#include "device_model.h"
#include "resources.h"
#include "vrdma/abi.h"

namespace vrdma::shim {

// True if `cur` -> `next` is a legal transition for `qp_type` and `mask`
// has every required and only allowed attributes (IBV_QP_STATE excluded).
// XRC QPs are checked as IBV_QPT_XRC_SEND and IBV_QPT_XRC_RECV.
bool qp_modify_is_ok(uint32_t cur, uint32_t next, uint32_t qp_type, uint32_t mask);

// Checks the values of the attributes named by `mask`. 0 or EINVAL.
int qp_check_attr_values(const abi::QpAttr& attr, uint32_t mask, const Quotas& q);

// Copies the attributes named by `mask` into the QP.
void qp_apply_attrs(Qp& qp, const abi::QpAttr& attr, uint32_t mask);

// The states in which a QP takes requests: RTR, RTS, SQD.
inline bool qp_takes_requests(uint32_t state) {
    return state == IBV_QPS_RTR || state == IBV_QPS_RTS || state == IBV_QPS_SQD;
}

// Moves a QP to ERR (its queues get flushed on the next pass). `event` is an
// ibv_event_type to post, or -1.
void qp_set_error(Context& ctx, Qp& qp, int event);
// UD send-queue error: SQE (only the send queue is flushed).
void qp_set_sq_error(Context& ctx, Qp& qp);

// Responder's RNR NAK timer (IB encoding of min_rnr_timer), in ns.
uint64_t rnr_timer_ns(uint8_t code);
// Local ACK timeout 4.096 us * 2^timeout, in ns. Timeout 0 (infinite in the
// IB spec) is treated as 14 (~67 ms) so that a vanished peer is reported.
uint64_t ack_timeout_ns(uint8_t timeout);

}  // namespace vrdma::shim
