#include "hca_completions.h"

#include <cstring>
#include <set>

#include "async_events.h"
#include "cq_writer.h"
#include "engine.h"
#include "hca_device.h"
#include "hca_ud.h"
#include "memory_windows.h"
#include "qp_state.h"
#include "work_queue.h"
#include "requester.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

// The guest's CQE for a device receive completion of `qp`.
abi::Cqe receive_cqe(const Qp& qp, const ibv_wc& wc, uint64_t wr_id) {
    abi::Cqe c{};
    c.wr_id = wr_id;
    c.status = wc.status;
    c.qp_num = qp.qpn;
    c.opcode = wc.status == IBV_WC_SUCCESS ? uint32_t(wc.opcode) : uint32_t(IBV_WC_RECV);
    if (wc.status == IBV_WC_SUCCESS) {
        c.byte_len = wc.byte_len;
        // The guest's view of the sender: the connected peer's QPN (a
        // device may leave src_qp 0 on RC, as rxe does) and LID (RoCE has
        // none).
        c.src_qp = qp.attr.dest_qp_num;
        c.slid = qp.attr.ah.dlid;
        c.sl = qp.attr.ah.sl;
        c.pkey_index = qp.attr.pkey_index;
        if (wc.wc_flags & IBV_WC_WITH_IMM) {
            c.wc_flags |= IBV_WC_WITH_IMM;
            c.imm_data = wc.imm_data;
        } else if (wc.wc_flags & IBV_WC_WITH_INV) {
            c.wc_flags |= IBV_WC_WITH_INV;
            c.imm_data = wc.invalidated_rkey;  // ibv_wc::invalidated_rkey shares imm_data's place
        }
    }
    return c;
}

void push_receive(Context& ctx, Qp& qp, const abi::Cqe& c) {
    if (c.status == IBV_WC_SUCCESS) qp_request_arrived(ctx, qp);  // COMM_EST in RTR
    // The device freed the window a Send with Invalidate named: the
    // shim's view of it follows.
    if (c.status == IBV_WC_SUCCESS && (c.wc_flags & IBV_WC_WITH_INV)) {
        if (Mw* mw = ctx.mws.get(ctx.keys.lookup(c.imm_data, KeyKind::Mw)); mw && mw->kept) dev_of(*mw)->bound = false;
        invalidate_remote(ctx, qp, c.imm_data);
    }
    // The device does not say whether the message was solicited: every
    // receive counts as solicited (a solicited-only waiter may wake for an
    // unsolicited one; it never sleeps through a solicited one).
    cq_push(ctx, qp.recv_cq, c, true);
    if (c.status == IBV_WC_SUCCESS) return;
    // A receive the device failed puts the QP in error (the device's QP is).
    // For RC a device raises the async event too; rxe raises none, so the
    // shim does, as its own RC responder would (a flush is no new error).
    int event = -1;
    if (qp.type == IBV_QPT_RC && c.status != IBV_WC_WR_FLUSH_ERR)
        event = c.status == IBV_WC_LOC_LEN_ERR ? IBV_EVENT_QP_REQ_ERR : IBV_EVENT_QP_FATAL;
    qp_set_error(ctx, qp, event);
}

void receive_done(HcaDevice& dev, Engine& eng, Context& ctx, Qp& qp, const DeviceCompletion& dc) {
    if (dc.idx != qp.rq.cons || dc.idx == dev_of(qp)->rq_posted) return;  // flushed by the shim already
    abi::Cqe c;
    if (qp.type == IBV_QPT_UD && dc.wc->status == IBV_WC_SUCCESS && dev_of(qp)->headers) {
        // The scatter list too (the GRH goes there), read again from the
        // ring as the device got it (or as the guest changed it since).
        RecvWork w;
        read_recv_wqe(qp.rq, qp.rq.cons, qp.max_recv_sge, w);
        c = receive_cqe(qp, *dc.wc, w.wr_id);
        hca_ud_received(dev, eng, ctx, qp, *dc.wc, dev_of(qp)->headers->at(dc.idx), w.sge, w.num_sge, c);
    } else {
        abi::RecvWqe hdr;
        std::memcpy(&hdr, qp.rq.slot(qp.rq.cons), sizeof(hdr));
        c = receive_cqe(qp, *dc.wc, hdr.wr_id);
    }
    wq_consume(qp.rq);
    push_receive(ctx, qp, c);
}

// An SRQ receive (its shadow slot is already free again): the guest
// hears of it if the QP is still one bound on that SRQ, in the life that
// took the WQE (a reset drains the device CQs first: hca_bind.cpp), and a
// flush only while the QP is in error.
void srq_receive_done(HcaDevice& dev, Engine& eng, Context& ctx, Qp& qp, const DeviceCompletion& dc) {
    Srq* srq = ctx.srqs.get(qp.srq);
    if (!srq || dev_of(*srq) != dc.srq || !qp.carried) return;
    if (dc.wc->status == IBV_WC_WR_FLUSH_ERR && qp.state != IBV_QPS_ERR) return;
    abi::Cqe c = receive_cqe(qp, *dc.wc, dc.srq_wr_id);
    if (qp.type == IBV_QPT_UD && dc.wc->status == IBV_WC_SUCCESS && dc.srq->headers) {
        const DeviceSrq& d = *dc.srq;
        hca_ud_received(dev, eng, ctx, qp, *dc.wc, d.headers->at(dc.idx), &d.sges[uint64_t(dc.idx) * d.max_sge],
                        d.nsge[dc.idx], c);
    }
    push_receive(ctx, qp, c);
    srq_wqe_consumed(ctx, *srq, dc.srq->outstanding());
}

}  // namespace

void deliver_device_completion(HcaDevice& dev, Engine& eng, const DeviceCompletion& dc) {
    QpRef ref = eng.qpns().find_by_qpn(dc.qpn);
    if (!ref || !ref.qp->kept) return;
    Qp& qp = *ref.qp;
    Context& ctx = *ref.ctx;
    if (dc.srq)
        srq_receive_done(dev, eng, ctx, qp, dc);
    else if (!qp.carried || dev_of(qp)->gen != dc.gen)
        return;  // of an earlier life of the QP
    else if (dc.recv)
        receive_done(dev, eng, ctx, qp, dc);
    else
        requester_carried_done(eng, ctx, qp, dc.idx, dc.wc->status);
    ctx.mark_work(qp);  // the next WQEs may go, receives may be forwarded, a flush may run
}

void deliver_device_event(Engine& eng, HcaDevice& dev, const ibv_async_event& ev) {
    switch (ev.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR: {
        QpRef ref = eng.qpns().find_by_qpn(ev.element.qp->qp_num);
        if (!ref || !ref.qp->carried) return;
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
                if (qp.carried) users.insert(&ctx.guest());
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
