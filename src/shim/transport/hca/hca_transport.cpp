#include "hca_transport.h"

#include "engine.h"
#include "hca_bind.h"
#include "resources.h"
#include "work_queue.h"

namespace vrdma::shim {

SendResult HcaTransport::send(Engine& eng, Context&, Qp& qp, const Request& req, const Span*, uint32_t, Pins*,
                              Response& resp) {
    if (!req.wqe || !qp.device_bound) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    // A peer QP of this shim (--hca-local): the receives its guest posted
    // before this request was posted reach the device before it, as on one
    // HCA whose ibv_post_recv is synchronous. (A peer on another host has
    // its shim's forwarding delay: RC covers it with RNR retries; a UC
    // message sent in that window is lost, as UC may be.)
    if (eng.routes().lookup(qp.attr.ah.dlid) == &eng.local_transport())
        if (Engine::QpRef peer = eng.find_qp(qp.attr.ah.dlid, qp.attr.dest_qp_num); peer && peer.qp->device_bound)
            hca_service(eng, *peer.ctx, *peer.qp);
    if (dev_.post_send(*qp.dev, *req.wqe, qp.sq_next)) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    dev_.count_send(req.length);
    return SendResult::InFlight;
}

}  // namespace vrdma::shim
