#include "hca_transport.h"

#include "engine.h"
#include "hca_bind.h"
#include "hca_ud.h"
#include "resources.h"
#include "work_queue.h"

namespace vrdma::shim {

namespace {

// The device objects the WQE names besides keys and addresses: a UD
// datagram's device AH, a bind's device window and MR. False if the device
// has none (a device refused to make it).
bool device_targets(Engine& eng, Context& ctx, const Qp& qp, const Request& req, HcaDevice::SendTargets& to) {
    const abi::SendWqe& h = req.wqe->hdr;
    if (qp.type == IBV_QPT_UD) {
        // The requester checked the AH and that the destination is on a
        // device (hca_ud_destination).
        Ah* ah = ctx.ahs.get(h.ah_handle);
        const Pd* pd = ctx.pds.get(qp.pd);
        const uint8_t* gid = hca_ud_destination(eng, req.dlid, req.dqpn);
        to.ah = ah && pd && gid ? hca_ud_ah(eng, *pd, *ah, gid) : nullptr;
        to.qkey = req.qkey;
        return to.ah != nullptr;
    }
    if (h.opcode == IBV_WR_BIND_MW) {
        // The shim's own bind (bind_window) already checked it.
        const Mw* mw = ctx.mws.get(h.mw_handle);
        const Mr* mr = ctx.mrs.get(ctx.keys.lookup(h.mr_lkey, KeyKind::Mr));
        to.mw = mw && mw->dev ? mw->dev->mw : nullptr;
        to.mr = mr && mr->dev ? mr->dev->mr : nullptr;
        return to.mw && (to.mr || (h.mr_lkey == 0 && h.compare_add == 0));
    }
    return true;
}

}  // namespace

SendResult HcaTransport::send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span*, uint32_t, Pins*,
                              Response& resp) {
    if (!req.wqe || !qp.device_bound) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    // A peer QP of this shim (--hca-local, or UD): the receives its guest
    // posted before this request was posted reach the device before it, as
    // on one HCA whose ibv_post_recv is synchronous. (A peer on another
    // host has its shim's forwarding delay: RC covers it with RNR retries; a
    // UC message or a datagram sent in that window is lost, as they may be.)
    if (eng.serves(req.dlid))
        if (Engine::QpRef peer = eng.find_qp(req.dlid, req.dqpn); peer && peer.qp->device_bound)
            hca_service(eng, *peer.ctx, *peer.qp);
    HcaDevice::SendTargets to;
    if (!device_targets(eng, ctx, qp, req, to) || dev_.post_send(*qp.dev, *req.wqe, qp.sq_next, to)) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    dev_.count_send(req.length);
    return SendResult::InFlight;
}

}  // namespace vrdma::shim
