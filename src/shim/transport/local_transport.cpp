#include "local_transport.h"

#include <infiniband/verbs.h>

#include "responder.h"

namespace vrdma::shim {

SendResult LocalTransport::send(Engine& eng, Context&, Qp&, const Request& req, const Span* local,
                                uint32_t nlocal, Pins*, Response& resp) {
    Delivery d;
    responder_begin(eng, req, d);
    if (d.resp.syndrome == Syndrome::Ack && d.length) {
        if (req.opcode == IBV_WR_RDMA_READ)
            copy_sg(local, nlocal, 0, d.spans, d.nspans, d.length);
        else
            copy_sg(d.spans, d.nspans, d.skip, local, nlocal, d.length);
    }
    responder_finish(d);
    resp = d.resp;
    return SendResult::Done;
}

}  // namespace vrdma::shim
