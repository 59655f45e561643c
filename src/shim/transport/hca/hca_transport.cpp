#include "hca_transport.h"

#include "resources.h"
#include "work_queue.h"

namespace vrdma::shim {

SendResult HcaTransport::send(Engine&, Context&, Qp& qp, const Request& req, const Span*, uint32_t, Pins*,
                              Response& resp) {
    if (!req.wqe || !qp.device_bound) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    if (dev_.post_send(*qp.dev, *req.wqe, qp.sq_next)) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    dev_.count_send(req.length);
    return SendResult::InFlight;
}

}  // namespace vrdma::shim
