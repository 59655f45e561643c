#include "hca_completions.h"

#include <cstring>
#include <set>

#include "async_events.h"
#include "cq_writer.h"
#include "engine.h"
#include "hca_device.h"
#include "qp_state.h"
#include "requester.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

void receive_done(Context& ctx, Qp& qp, const DeviceCompletion& dc) {
    const ibv_wc& wc = *dc.wc;
    if (dc.idx != qp.rq.cons || dc.idx == qp.dev->rq_posted) return;  // flushed by the shim already
    abi::RecvWqe hdr;
    std::memcpy(&hdr, qp.rq.slot(qp.rq.cons), sizeof(hdr));
    abi::Cqe c{};
    c.wr_id = hdr.wr_id;
    c.status = wc.status;
    c.qp_num = qp.qpn;
    c.opcode = wc.status == IBV_WC_SUCCESS ? uint32_t(wc.opcode) : uint32_t(IBV_WC_RECV);
    if (wc.status == IBV_WC_SUCCESS) {
        c.byte_len = wc.byte_len;
        c.src_qp = wc.src_qp;
        // The guest's view of the sender: the connected peer's LID, not the
        // device's (RoCE has none).
        c.slid = qp.attr.ah.dlid;
        c.sl = qp.attr.ah.sl;
        c.pkey_index = qp.attr.pkey_index;
        if (wc.wc_flags & IBV_WC_WITH_IMM) {
            c.wc_flags |= IBV_WC_WITH_IMM;
            c.imm_data = wc.imm_data;
        }
    }
    wq_consume(qp.rq);
    if (wc.status == IBV_WC_SUCCESS) qp_request_arrived(ctx, qp);  // COMM_EST in RTR
    // The device does not say whether the message was solicited: every
    // receive counts as solicited (a solicited-only waiter may wake for an
    // unsolicited one; it never sleeps through a solicited one).
    cq_push(ctx, qp.recv_cq, c, true);
    if (wc.status != IBV_WC_SUCCESS) qp_set_error(ctx, qp, -1);
}

}  // namespace

void deliver_device_completion(Engine& eng, const DeviceCompletion& dc) {
    Engine::QpRef ref = eng.find_qp_by_qpn(dc.qpn);
    if (!ref || !ref.qp->device_bound || ref.qp->dev->gen != dc.gen) return;
    Qp& qp = *ref.qp;
    Context& ctx = *ref.ctx;
    if (dc.recv)
        receive_done(ctx, qp, dc);
    else
        requester_device_done(eng, ctx, qp, dc.idx, dc.wc->status);
    ctx.mark_work(qp);  // the next WQEs may go, receives may be forwarded, a flush may run
}

void deliver_device_event(Engine& eng, HcaDevice& dev, const ibv_async_event& ev) {
    switch (ev.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR: {
        Engine::QpRef ref = eng.find_qp_by_qpn(ev.element.qp->qp_num);
        if (!ref || !ref.qp->device_bound) return;
        LOG_WARN("hca %s: QP %u: %s", dev.name().c_str(), ref.qp->qpn, ibv_event_type_str(ev.event_type));
        qp_set_error(*ref.ctx, *ref.qp, ev.event_type);
        return;
    }
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_DEVICE_FATAL: {
        // The guests with QPs on the device hear of it, on every context
        // (as every context of a device does), as of their own port; the
        // port stays up for their traffic on this host and over TCP.
        LOG_WARN("hca %s: %s", dev.name().c_str(), ibv_event_type_str(ev.event_type));
        const uint32_t type = ev.event_type == IBV_EVENT_PORT_ACTIVE ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR;
        std::set<const GuestIdentity*> users;
        eng.for_each_context([&](Context& ctx) {
            ctx.qps.for_each([&](uint32_t, Qp& qp) {
                if (qp.device_bound) users.insert(&ctx.guest());
            });
        });
        eng.for_each_context([&](Context& ctx) {
            if (users.count(&ctx.guest())) post_port_event(ctx, type);
        });
        return;
    }
    default:
        return;
    }
}

}  // namespace vrdma::shim
