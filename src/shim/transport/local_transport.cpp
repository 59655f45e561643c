#include "local_transport.h"

#include <infiniband/verbs.h>

#include "responder.h"

namespace vrdma::shim {

SendResult LocalTransport::send(Engine& eng, Context&, Qp&, const Request& req, const Span* local,
                                uint32_t nlocal, Pins*, Response& resp) {
    Delivery d;
    responder_begin(eng, req, d);
    if (d.resp.syndrome == Syndrome::Ack && d.length) {
        // A page the guest took away under the copy (fault_guard.h) fails
        // the side it belonged to: the requester's memory gives it
        // IBV_WC_LOC_PROT_ERR (the receive, if one was taken, never gets its
        // payload), the responder's an access NAK.
        const bool read = req.opcode == IBV_WR_RDMA_READ;
        CopyFault f = read ? copy_sg(local, nlocal, 0, d.spans, d.nspans, d.length)
                           : copy_sg(d.spans, d.nspans, d.skip, local, nlocal, d.length);
        const bool local_fault = f == (read ? CopyFault::Dst : CopyFault::Src);
        if (f != CopyFault::None && !local_fault) {
            responder_memory_fault(d);
        } else if (local_fault) {
            if (req.qp_type == IBV_QPT_RC)
                responder_finish(d, false);
            else
                responder_memory_fault(d);
            d.resp.syndrome = Syndrome::LocalFault;
        }
    }
    responder_finish(d);
    resp = d.resp;
    return SendResult::Done;
}

}  // namespace vrdma::shim
