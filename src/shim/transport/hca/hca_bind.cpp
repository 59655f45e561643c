#include "hca_bind.h"

#include <infiniband/verbs.h>

#include <cerrno>

#include "async_events.h"
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

// The peer shim's device GID when `qp` must go through the device; null
// when it goes as it would without one.
// (UD: this shim's own GID; a UD QP's datagrams each have their path.)
const uint8_t* device_path(const HcaDevice& dev, Engine& eng, const Context& ctx, const Qp& qp) {
    // Partitions are enforced by the shims' responders, which the device
    // path bypasses: only the default partition goes through the device.
    const auto& keys = ctx.guest().pkeys;
    const uint16_t pkey = qp.attr.pkey_index < keys.size() ? keys[qp.attr.pkey_index] : 0xffff;
    if ((pkey & 0x7fff) != 0x7fff) return nullptr;
    if (qp.type == IBV_QPT_UD) return dev.gid();
    const Transport* t = eng.routes().lookup(qp.attr.ah.dlid);
    return t ? t->device_gid() : nullptr;
}

// A QP on an SRQ is bound only if the SRQ can feed the device: it has a
// device SRQ and no QP on it is connected without the device (whose
// receives the shim takes from the guest's ring, which the device SRQ
// then empties). The first QP bound starts the feeding (bind). 0 or
// EOPNOTSUPP.
int srq_admits_bound(Context& ctx, Qp& qp) {
    if (!qp.srq) return 0;
    Srq* srq = ctx.srqs.get(qp.srq);
    if (!srq || !srq->kept) return EOPNOTSUPP;
    if (srq->feeds_device) {
        if (dev_of(*srq)->ud == (qp.type == IBV_QPT_UD)) return 0;
        LOG_WARN("guest %s: QP %u: its SRQ feeds the device for %s QPs; it cannot also serve a %s QP there",
                 ctx.guest().name.c_str(), qp.qpn, dev_of(*srq)->ud ? "UD" : "connected",
                 qp.type == IBV_QPT_UD ? "UD" : "connected");
        return EOPNOTSUPP;
    }
    bool shim_user = false;
    ctx.qps.for_each([&](uint32_t, Qp& o) {
        shim_user |= &o != &qp && o.srq == qp.srq && qp_takes_requests(o.state) && !o.carried;
    });
    if (shim_user) {
        LOG_WARN("guest %s: QP %u: its SRQ serves QPs of this host or of TCP peers; it cannot also feed the device",
                 ctx.guest().name.c_str(), qp.qpn);
        return EOPNOTSUPP;
    }
    return 0;
}

// A QP connected without the device may not use an SRQ that feeds it.
int srq_admits_unbound(Context& ctx, const Qp& qp) {
    const Srq* srq = qp.srq ? ctx.srqs.get(qp.srq) : nullptr;
    if (!srq || !srq->feeds_device) return 0;
    LOG_WARN("guest %s: QP %u to lid %u does not go through the device, and its SRQ feeds the device",
             ctx.guest().name.c_str(), qp.qpn, qp.attr.ah.dlid);
    return EOPNOTSUPP;
}

// Brings the bound QP's device QP to `state` (RTR or RTS) from RESET.
int bind(HcaTransport& hca, Engine& eng, Context& ctx, Qp& qp, uint32_t state, const uint8_t* gid) {
    HcaDevice& dev = hca.device();
    if (int rc = srq_admits_bound(ctx, qp)) return rc;
    if (int rc = dev.to_rtr(*dev_of(qp), qp.attr, gid)) return rc;
    if (state == IBV_QPS_RTS || state == IBV_QPS_SQD)
        if (int rc = dev.to_rts(*dev_of(qp), qp.attr)) return rc;
    dev_of(qp)->rq_posted = qp.rq.cons;
    if (Srq* srq = qp.srq ? ctx.srqs.get(qp.srq) : nullptr; srq && !srq->feeds_device) {
        // The first QP bound on the SRQ: UD receives get header slots.
        DeviceSrq& d = *dev_of(*srq);
        d.ud = qp.type == IBV_QPT_UD;
        int err = 0;
        if (d.ud && !(d.headers = dev.make_header_slots(d.pd, uint32_t(d.wr_ids.size()), err))) return err;
        srq->feeds_device = true;
    }
    qp.carried = true;
    qp.transport = &hca;
    if (qp.type == IBV_QPT_UD) {
        // Peer shims learn who owns the QPN their devices will name as the
        // source of its datagrams, and that its receives are on the device.
        if (eng.ud_directory()) eng.ud_directory()->announce_ud(ctx.guest().lid, qp.qpn, ctx.guest().guid);
        // And the other workers of this shim (hca_ud.h).
        eng.shared().set_device_ud(qp.qpn, ctx.guest().lid, ctx.guest().guid);
        LOG_INFO("guest %s: UD QP %u is on %s", ctx.guest().name.c_str(), qp.qpn, dev.name().c_str());
        return 0;
    }
    LOG_INFO("guest %s: QP %u goes through %s to lid %u QP %u", ctx.guest().name.c_str(), qp.qpn,
             dev.name().c_str(), qp.attr.ah.dlid, qp.attr.dest_qp_num);
    return 0;
}

// The SRQ's new receive WQEs into its device SRQ, as many as it has room
// for; each guest ring slot is given back as soon as its WQE is on the
// device (DeviceSrq).
void forward_srq_recvs(HcaDevice& dev, Context& ctx, Qp& qp) {
    Srq* srq = ctx.srqs.get(qp.srq);
    if (!srq || !srq->kept || !srq->feeds_device) return;
    DeviceSrq& d = *dev_of(*srq);
    uint32_t n;
    if (!wq_pending(srq->wq, n)) {
        qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
        return;
    }
    RecvWork w;
    for (; n && !d.free.empty() && !d.broken; --n) {
        if (read_recv_wqe(srq->wq, srq->wq.cons, srq->max_sge, w) != IBV_WC_SUCCESS ||
            dev.post_srq_recv(d, w)) {
            // The SRQ's fault, not this QP's: the SRQ is in error, as on an
            // HCA, and takes no more receives.
            LOG_WARN("guest %s: SRQ %u: a receive WQE the device cannot take; the SRQ is in error",
                     ctx.guest().name.c_str(), srq->srqn);
            d.broken = true;
            post_srq_event(ctx, *srq, IBV_EVENT_SRQ_ERR);
            return;
        }
        wq_consume(srq->wq);
    }
}

void forward_recvs(HcaDevice& dev, Context& ctx, Qp& qp) {
    if (qp.srq) {
        forward_srq_recvs(dev, ctx, qp);
        return;
    }
    DeviceQp& d = *dev_of(qp);
    uint32_t n;
    if (!wq_pending(qp.rq, n)) {
        qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
        return;
    }
    const uint32_t end = ring_advance(qp.rq.cons, n, qp.rq.entries);
    RecvWork w;
    while (d.rq_posted != end) {
        if (read_recv_wqe(qp.rq, d.rq_posted, qp.max_recv_sge, w) != IBV_WC_SUCCESS ||
            dev.post_recv(d, w, d.rq_posted)) {
            LOG_WARN("guest %s: QP %u: a receive WQE the device cannot take", ctx.guest().name.c_str(), qp.qpn);
            qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
            return;
        }
        d.rq_posted = ring_next(d.rq_posted, qp.rq.entries);
    }
}

}  // namespace

std::shared_ptr<DeviceQp> hca_create_qp(HcaDevice& dev, Engine& eng, const Pd& pd, const Srq* srq, uint32_t type,
                                                         uint32_t send_wr, uint32_t recv_wr, uint32_t send_sge,
                                                         uint32_t recv_sge, uint32_t max_inline) {
    if (!pd.kept) return nullptr;
    if (srq && !srq->kept) return nullptr;
    if (srq) recv_wr = srq->wq.entries;  // the CQ's room for its receives
    // A QPN this shim already gave a QP without a device QP is not taken
    // twice: the device gives another.
    for (int attempt = 0; attempt < 4; ++attempt) {
        int err = 0;
        std::unique_ptr<DeviceQp> q =
            dev.create_qp(shared_dev_of(pd), type, send_wr, recv_wr, send_sge, recv_sge, max_inline,
                                 srq ? shared_dev_of(*srq) : nullptr, err);
        if (!q) return nullptr;
        if (!eng.qpns().taken(q->qp->qp_num)) return std::shared_ptr<DeviceQp>(q.release());
    }
    return nullptr;
}

std::shared_ptr<DeviceSrq> hca_create_srq(HcaDevice& dev, const Pd& pd, uint32_t entries, uint32_t max_sge) {
    if (!pd.kept) return nullptr;
    int err = 0;
    return dev.create_srq(shared_dev_of(pd), entries, max_sge, err);
}

int hca_follow(HcaTransport& hca, Engine& eng, Context& ctx, Qp& qp, uint32_t next) {
    HcaDevice& dev = hca.device();
    if (next == IBV_QPS_RESET) {
        if (qp.carried) {
            dev_of(qp)->to_reset();
            // What the device completed before the reset reaches the guest
            // now, as of the QP's old life (SRQ receives carry no
            // generation: drained here, they cannot reach the next life).
            dev.poll(eng);
        }
        qp.carried = false;
        return 0;
    }
    if (next != IBV_QPS_RTR && next != IBV_QPS_RTS) return 0;
    if (qp.carried) {
        if (qp.type == IBV_QPT_UD && qp.attr.qkey != dev_of(qp)->qkey && dev.set_qkey(*dev_of(qp), qp.attr.qkey))
            return EINVAL;
        if (next == IBV_QPS_RTS && qp.state == IBV_QPS_RTR) return dev.to_rts(*dev_of(qp), qp.attr) ? EINVAL : 0;
        return 0;
    }
    const uint8_t* gid = device_path(dev, eng, ctx, qp);
    if (!gid) return next == IBV_QPS_RTR ? srq_admits_unbound(ctx, qp) : 0;
    if (!qp.kept) {
        LOG_WARN("guest %s: QP %u to lid %u needs the device and has no device QP (%s)", ctx.guest().name.c_str(),
                 qp.qpn, qp.attr.ah.dlid,
                 qp.xrc != XrcRole::None ? "XRC does not run on the device" : "the device refused it");
        return EOPNOTSUPP;
    }
    const int rc = bind(hca, eng, ctx, qp, next, gid);
    return rc == EOPNOTSUPP ? rc : rc ? EINVAL : 0;
}

void hca_service(HcaTransport& hca, Engine& eng, Context& ctx, Qp& qp) {
    if (!qp.kept || !qp_takes_requests(qp.state)) return;
    if (!qp.carried) {
        // The route to the peer appeared (or changed) since the QP was
        // connected: bind it now if the peer has a device.
        if (dev_of(qp)->route_gen == eng.routes().generation()) return;
        dev_of(qp)->route_gen = eng.routes().generation();
        const uint8_t* gid = device_path(hca.device(), eng, ctx, qp);
        if (!gid) return;
        if (bind(hca, eng, ctx, qp, qp.state, gid)) {
            qp_set_error(ctx, qp, IBV_EVENT_QP_FATAL);
            return;
        }
    }
    forward_recvs(hca.device(), ctx, qp);
}

}  // namespace vrdma::shim
