#include "hca_bind.h"

#include <infiniband/verbs.h>

#include <cerrno>

#include "context.h"
#include "engine.h"
#include "hca_device.h"
#include "hca_transport.h"
#include "qp_state.h"
#include "transport.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"
#include "work_queue.h"

namespace vrdma::shim {
namespace {

bool connected_state(uint32_t s) { return s == IBV_QPS_RTR || s == IBV_QPS_RTS || s == IBV_QPS_SQD; }

// The peer shim's device GID when `qp` must go through the device; null
// when it goes as it would without one.
const uint8_t* device_path(Engine& eng, const Context& ctx, const Qp& qp) {
    if (!eng.hca() || (qp.type != IBV_QPT_RC && qp.type != IBV_QPT_UC)) return nullptr;
    const Transport* t = eng.routes().lookup(qp.attr.ah.dlid);
    const uint8_t* gid = t ? t->device_gid() : nullptr;
    if (!gid) return nullptr;
    // Partitions are enforced by the shims' responders, which the device
    // path bypasses: only the default partition goes through the device.
    const auto& keys = ctx.guest().pkeys;
    const uint16_t pkey = qp.attr.pkey_index < keys.size() ? keys[qp.attr.pkey_index] : 0xffff;
    if ((pkey & 0x7fff) != 0x7fff) return nullptr;
    return gid;
}

// Brings the bound QP's device QP to `state` (RTR or RTS) from RESET.
int bind(Engine& eng, Context& ctx, Qp& qp, uint32_t state, const uint8_t* gid) {
    HcaDevice& dev = *eng.hca();
    if (int rc = dev.to_rtr(*qp.dev, qp.attr, gid)) return rc;
    if (state == IBV_QPS_RTS || state == IBV_QPS_SQD)
        if (int rc = dev.to_rts(*qp.dev, qp.attr)) return rc;
    qp.dev->rq_posted = qp.rq.cons;
    qp.device_bound = true;
    qp.transport = eng.hca_transport();
    LOG_INFO("guest %s: QP %u goes through %s to lid %u QP %u", ctx.guest().name.c_str(), qp.qpn,
             dev.name().c_str(), qp.attr.ah.dlid, qp.attr.dest_qp_num);
    return 0;
}

void forward_recvs(Engine& eng, Context& ctx, Qp& qp) {
    DeviceQp& d = *qp.dev;
    uint32_t n;
    if (!wq_pending(qp.rq, n)) {
        qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
        return;
    }
    const uint32_t end = ring_advance(qp.rq.cons, n, qp.rq.entries);
    RecvWork w;
    while (d.rq_posted != end) {
        if (read_recv_wqe(qp.rq, d.rq_posted, qp.max_recv_sge, w) != IBV_WC_SUCCESS ||
            eng.hca()->post_recv(d, w, d.rq_posted)) {
            LOG_WARN("guest %s: QP %u: a receive WQE the device cannot take", ctx.guest().name.c_str(), qp.qpn);
            qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
            return;
        }
        d.rq_posted = ring_next(d.rq_posted, qp.rq.entries);
    }
}

}  // namespace

std::unique_ptr<DeviceQp, DeviceQpDeleter> hca_create_qp(Engine& eng, const Pd& pd, uint32_t type, uint32_t send_wr,
                                                         uint32_t recv_wr, uint32_t send_sge, uint32_t recv_sge,
                                                         uint32_t max_inline) {
    if (!eng.hca() || !pd.dev || (type != IBV_QPT_RC && type != IBV_QPT_UC)) return nullptr;
    // A QPN this shim already gave a QP without a device QP is not taken
    // twice: the device gives another.
    for (int attempt = 0; attempt < 4; ++attempt) {
        int err = 0;
        std::unique_ptr<DeviceQp> q =
            eng.hca()->create_qp(pd.dev, type, send_wr, recv_wr, send_sge, recv_sge, max_inline, err);
        if (!q) return nullptr;
        if (!eng.qpn_taken(q->qp->qp_num)) return std::unique_ptr<DeviceQp, DeviceQpDeleter>(q.release());
    }
    return nullptr;
}

int hca_follow(Engine& eng, Context& ctx, Qp& qp, uint32_t next) {
    if (!eng.hca()) return 0;
    if (next == IBV_QPS_RESET) {
        if (qp.device_bound) qp.dev->to_reset();
        qp.device_bound = false;
        return 0;
    }
    if (next != IBV_QPS_RTR && next != IBV_QPS_RTS) return 0;
    if (qp.device_bound) {
        if (next == IBV_QPS_RTS && qp.state == IBV_QPS_RTR) return eng.hca()->to_rts(*qp.dev, qp.attr) ? EINVAL : 0;
        return 0;
    }
    const uint8_t* gid = device_path(eng, ctx, qp);
    if (!gid) return 0;
    if (!qp.dev) {
        LOG_WARN("guest %s: QP %u to lid %u needs the device and has no device QP (%s)", ctx.guest().name.c_str(),
                 qp.qpn, qp.attr.ah.dlid, qp.srq ? "SRQs do not go through the device yet" : "the device refused it");
        return EOPNOTSUPP;
    }
    return bind(eng, ctx, qp, next, gid) ? EINVAL : 0;
}

void hca_service(Engine& eng, Context& ctx, Qp& qp) {
    if (!qp.dev || !connected_state(qp.state)) return;
    if (!qp.device_bound) {
        // The route to the peer appeared (or changed) since the QP was
        // connected: bind it now if the peer has a device.
        if (qp.dev->route_gen == eng.routes().generation()) return;
        qp.dev->route_gen = eng.routes().generation();
        const uint8_t* gid = device_path(eng, ctx, qp);
        if (!gid) return;
        if (bind(eng, ctx, qp, qp.state, gid)) {
            qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
            return;
        }
    }
    forward_recvs(eng, ctx, qp);
}

}  // namespace vrdma::shim
