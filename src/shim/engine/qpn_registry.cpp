#include "qpn_registry.h"

#include "context.h"
#include "shared_tables.h"

namespace vrdma::shim {

uint32_t QpnRegistry::alloc() { return shared_.alloc_qpn(); }

bool QpnRegistry::taken(uint32_t qpn) const { return shared_.qpn_taken(qpn); }

void QpnRegistry::add(uint32_t qpn, Context& ctx, uint32_t handle) {
    shared_.take_qpn(qpn);
    qpns_.set(qpn, Loc{&ctx, handle});
}

void QpnRegistry::remove(uint32_t qpn) {
    if (!qpns_.erase(qpn)) return;
    shared_.multicast().detach_all(qpn);
    shared_.release_qpn(qpn);
}

QpRef QpnRegistry::find_by_qpn(uint32_t qpn) const {
    const Loc* loc = qpns_.find(qpn);
    if (!loc || loc->ctx->dead) return {};
    Qp* qp = loc->ctx->qps.get(loc->handle);
    if (!qp) return {};
    return QpRef{loc->ctx, qp, loc->handle};
}

QpRef QpnRegistry::find(uint16_t lid, uint32_t qpn) const {
    QpRef ref = find_by_qpn(qpn);
    return ref && ref.ctx->guest().lid == lid ? ref : QpRef{};
}

}  // namespace vrdma::shim
