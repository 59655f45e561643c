#include "hca_transport.h"

#include "engine.h"
#include "hca_bind.h"
#include "hca_ud.h"
#include "resources.h"
#include "work_queue.h"

namespace vrdma::shim {

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
    if (eng.routes().lookup(req.dlid) == &eng.local_transport())
        if (Engine::QpRef peer = eng.find_qp(req.dlid, req.dqpn); peer && peer.qp->device_bound)
            hca_service(eng, *peer.ctx, *peer.qp);
    ibv_ah* ah = nullptr;
    if (qp.type == IBV_QPT_UD) {
        // The requester checked the AH and that the destination is on a
        // device (hca_ud_destination).
        Ah* guest_ah = ctx.ahs.get(req.wqe->hdr.ah_handle);
        const Pd* pd = ctx.pds.get(qp.pd);
        const uint8_t* gid = hca_ud_destination(eng, req.dlid, req.dqpn);
        ah = guest_ah && pd && gid ? hca_ud_ah(eng, *pd, *guest_ah, gid) : nullptr;
        if (!ah) {
            resp.syndrome = Syndrome::LocalFault;
            return SendResult::Done;
        }
    }
    if (dev_.post_send(*qp.dev, *req.wqe, qp.sq_next, ah, req.qkey)) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    dev_.count_send(req.length);
    return SendResult::InFlight;
}

}  // namespace vrdma::shim
