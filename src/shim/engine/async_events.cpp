#include "async_events.h"

#include "transport.h"
#include "work_queue.h"

#include <infiniband/verbs.h>

namespace vrdma::shim {

void post_qp_event(Context& ctx, Qp& qp, uint32_t event_type) {
    if (ctx.post_async_event(event_type, qp.user_handle)) ++qp.async_events;
}

void post_cq_event(Context& ctx, Cq& cq, uint32_t event_type) {
    if (ctx.post_async_event(event_type, cq.user_handle)) ++cq.async_events;
}

void post_srq_event(Context& ctx, Srq& srq, uint32_t event_type) {
    if (ctx.post_async_event(event_type, srq.user_handle)) ++srq.async_events;
}

void srq_wqe_consumed(Context& ctx, Srq& srq, uint32_t on_device) {
    uint32_t left;
    if (srq.limit && wq_pending(srq.wq, left) && left + on_device < srq.limit) {
        srq.limit = 0;  // one event per arming
        post_srq_event(ctx, srq, IBV_EVENT_SRQ_LIMIT_REACHED);
    }
}

void post_port_event(Context& ctx, uint32_t event_type) { ctx.post_async_event(event_type, 1); }

void post_device_fatal(Context& ctx) { ctx.post_async_event(IBV_EVENT_DEVICE_FATAL, 0); }

void qp_entered_error(Context& ctx, Qp& qp) {
    // The transport that carries it stops it too (a device QP).
    if (qp.transport) qp.transport->qp_failed(qp);
    if (qp.srq) post_qp_event(ctx, qp, IBV_EVENT_QP_LAST_WQE_REACHED);
}

void qp_request_arrived(Context& ctx, Qp& qp) {
    if (qp.state != IBV_QPS_RTR || qp.resp.comm_est_sent) return;
    qp.resp.comm_est_sent = true;
    post_qp_event(ctx, qp, IBV_EVENT_COMM_EST);
}

}  // namespace vrdma::shim
