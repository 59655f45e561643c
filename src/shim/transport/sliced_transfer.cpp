#include "sliced_transfer.h"

#include <infiniband/verbs.h>

#include "engine.h"
#include "transport.h"

namespace vrdma::shim {

void SlicedCopyDeleter::operator()(SlicedCopy* s) const { delete s; }

bool sliceable(const Request& req) {
    return req.length > TurnScheduler::kSliceBytes && req.qp_type != IBV_QPT_UD &&
           (request_carries_payload(req.opcode) || request_reads(req.opcode));
}

bool same_request(const Request& a, const Request& b) {
    return a.psn == b.psn && a.opcode == b.opcode && a.length == b.length && a.rkey == b.rkey &&
           a.remote_addr == b.remote_addr && a.dlid == b.dlid && a.dqpn == b.dqpn;
}

void abandon_transfer(Engine& eng, Qp& qp) {
    SlicedCopy* s = qp.req.sliced.get();
    if (s && s->active && s->owner) s->owner->abandon(eng, qp);
}

void forget_transfers(Engine& eng, const Transport* owner) {
    eng.for_each_context([owner](Context& ctx) {
        ctx.qps.for_each([owner](uint32_t, Qp& qp) {
            SlicedCopy* s = qp.req.sliced.get();
            if (!s || s->owner != owner) return;
            s->active = false;
            s->owner = nullptr;
            s->target.clear();
        });
    });
}

SlicedCopy& sliced_state(Qp& qp) {
    if (!qp.req.sliced) qp.req.sliced.reset(new SlicedCopy);
    return *qp.req.sliced;
}

}  // namespace vrdma::shim
