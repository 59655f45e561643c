// Affiliated and unaffiliated async events (docs/protocol.md "Events"): one
// 16-byte ib_uverbs_async_event_desc record into the context's async pipe.
// Every record that names an object is counted on it; DestroyCq/Qp/Srq
// report the counts so the provider can tell whether records naming a
// destroyed object may still be unread.
#pragma once

#include <cstdint>

#include "context.h"
#include "resources.h"

namespace vrdma::shim {

void post_qp_event(Context& ctx, Qp& qp, uint32_t event_type);
void post_cq_event(Context& ctx, Cq& cq, uint32_t event_type);
void post_srq_event(Context& ctx, Srq& srq, uint32_t event_type);
// PORT_ACTIVE, PORT_ERR, ... for port 1 (the element is the port number).
void post_port_event(Context& ctx, uint32_t event_type);
// DEVICE_FATAL (the element is ignored by libibverbs; 0).
void post_device_fatal(Context& ctx);

// The QP has just entered ERR (by modify or by an error): a QP attached to
// an SRQ raises LAST_WQE_REACHED (no further WQE of the SRQ will be
// consumed for it).
void qp_entered_error(Context& ctx, Qp& qp);

// A receive WQE of the SRQ was consumed: an armed limit raises
// SRQ_LIMIT_REACHED (once per arming) when fewer than it are left, counting
// those in the guest's ring and `on_device` more a device SRQ holds.
void srq_wqe_consumed(Context& ctx, Srq& srq, uint32_t on_device);

// A request reached the QP as RC responder: the first one while the QP is in
// RTR raises COMM_EST (once until the QP is reset).
void qp_request_arrived(Context& ctx, Qp& qp);

}  // namespace vrdma::shim
