#include "hca_transport.h"

#include <cerrno>

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
bool device_targets(HcaDevice& dev, Engine& eng, Context& ctx, const Qp& qp, const Request& req, HcaDevice::SendTargets& to) {
    const abi::SendWqe& h = req.wqe->hdr;
    if (qp.type == IBV_QPT_UD) {
        // The requester checked the AH and that the destination is on a
        // device (hca_ud_destination).
        Ah* ah = ctx.ahs.get(h.ah_handle);
        const Pd* pd = ctx.pds.get(qp.pd);
        const uint8_t* gid = hca_ud_destination(dev, eng, req.dlid, req.dqpn);
        to.ah = ah && pd && gid ? hca_ud_ah(dev, *pd, *ah, gid) : nullptr;
        to.qkey = req.qkey;
        return to.ah != nullptr;
    }
    if (h.opcode == IBV_WR_BIND_MW) {
        // The shim's own bind (bind_window) already checked it.
        const Mw* mw = ctx.mws.get(h.mw_handle);
        const Mr* mr = ctx.mrs.get(ctx.keys.lookup(h.mr_lkey, KeyKind::Mr));
        to.mw = mw && mw->kept ? dev_of(*mw)->mw : nullptr;
        to.mr = mr && mr->kept ? dev_of(*mr)->mr : nullptr;
        return to.mw && (to.mr || (h.mr_lkey == 0 && h.compare_add == 0));
    }
    return true;
}

}  // namespace

SendResult HcaTransport::send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span*, uint32_t, Pins*,
                              Response& resp) {
    if (!req.wqe || !qp.carried) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    // A peer QP of this shim (--hca-local, or UD): the receives its guest
    // posted before this request was posted reach the device before it, as
    // on one HCA whose ibv_post_recv is synchronous. (A peer on another
    // host has its shim's forwarding delay: RC covers it with RNR retries; a
    // UC message or a datagram sent in that window is lost, as they may be.)
    if (eng.serves(req.dlid))
        if (QpRef peer = eng.qpns().find(req.dlid, req.dqpn); peer && peer.qp->carried)
            hca_service(*this, eng, *peer.ctx, *peer.qp);
    HcaDevice::SendTargets to;
    if (!device_targets(dev_, eng, ctx, qp, req, to) || dev_.post_send(*dev_of(qp), *req.wqe, qp.req.sq_next, to)) {
        resp.syndrome = Syndrome::LocalFault;
        return SendResult::Done;
    }
    dev_.count_send(req.length);
    return SendResult::InFlight;
}

void HcaTransport::limit_device(abi::DeviceAttr& a) const {
    // UD QPs receive on the device, where the shim's multicast groups never
    // see a datagram (cmd_mcast.cpp); and the device's SRQs are out of
    // reach of the shim's tag matching (cmd_srq.cpp).
    a.max_mcast_grp = a.max_mcast_qp_attach = a.max_total_mcast_qp_attach = a.max_tm_tags = 0;
}

// The guest's memory and QPs on the device are in the device PD.
int HcaTransport::pd_made(Engine&, Pd& pd) {
    int err = 0;
    pd.kept = dev_.alloc_pd(err);
    return pd.kept ? 0 : err;
}

// Memory the device refuses at registration (an iova whose offset in its
// page differs from the memory's, as a zero-based MR's may) still serves
// this host and TCP; an MR that is on the device stays there, or its
// re-registration fails.
int HcaTransport::mr_made(Engine&, const Pd& pd, const Mr& mr, const MrShape& shape, bool rereg,
                          Kept& made, uint32_t& key) {
    if (rereg ? !mr.kept : (!shape.length || mr.on_demand)) return 0;
    if (!pd.kept) return rereg ? EINVAL : 0;
    int err = 0;
    std::unique_ptr<DeviceMr> d = dev_.reg_mr(shared_dev_of(pd), shape.host, shape.length, shape.iova, shape.access, err);
    if (!d) return rereg ? err : 0;
    key = device_mr_key(*d);
    made.reset(d.release());
    return 0;
}

void HcaTransport::mw_made(Engine&, const Pd& pd, uint32_t type, Kept& made,
                           uint32_t& key) {
    if (!pd.kept || !dev_.takes_windows(type)) return;
    int err = 0;
    std::unique_ptr<DeviceMw> d = dev_.alloc_mw(shared_dev_of(pd), type, err);
    if (!d) return;
    key = d->mw->rkey;
    made.reset(d.release());
}

void HcaTransport::srq_made(Engine&, const Pd& pd, Srq& srq) {
    srq.kept = hca_create_srq(dev_, pd, srq.wq.entries, srq.max_sge);
}

uint32_t HcaTransport::qp_made(Engine& eng, const Pd& pd, const Srq* srq, Qp& qp, const abi::CmdCreateQpReq& r) {
    qp.kept = hca_create_qp(dev_, eng, pd, srq, r.qp_type, r.sq_entries, r.rq_entries, r.max_send_sge, r.max_recv_sge,
                           r.max_inline_data);
    return qp.kept ? dev_of(qp)->qp->qp_num : 0;
}

int HcaTransport::qp_moving(Engine& eng, Context& ctx, Qp& qp, uint32_t next) {
    return hca_follow(*this, eng, ctx, qp, next);
}

// The receives its device QP holds must not take data the guest was told
// were flushed.
void HcaTransport::qp_failed(Qp& qp) {
    if (qp.carried) dev_of(qp)->to_error();
}

void HcaTransport::datagram_missed(const Qp&) { ++dev_.stats().ud_lost; }

void HcaTransport::qp_pass(Engine& eng, Context& ctx, Qp& qp) { hca_service(*this, eng, ctx, qp); }

// A QP on the device sends through it to every UD QP on a device (hca_ud.h).
bool HcaTransport::carries_datagram(Engine& eng, uint16_t dlid, uint32_t dqpn) {
    return hca_ud_destination(dev_, eng, dlid, dqpn) != nullptr;
}

// The shim applies a bind or an invalidation to its own view of the window
// (requests of this host and over TCP use it); the device applies it to
// its window (requests through the device use that) and completes it. A
// bind through the device needs a device window; an invalidation goes to
// the device only if the device holds the window bound.
uint32_t HcaTransport::check_local_op(const Qp&, const Mw* mw, bool bind) const {
    return bind && (!mw || !mw->kept) ? uint32_t(IBV_WC_MW_BIND_ERR) : uint32_t(IBV_WC_SUCCESS);
}

LocalOp HcaTransport::post_local_op(Engine& eng, Context& ctx, Qp& qp, Mw* mw, SendWork& w, bool bind) {
    DeviceMw* dmw = mw ? dev_of(*mw) : nullptr;
    if (!dmw || !(bind || dmw->bound)) return LocalOp::Shim;
    dmw->bound = bind && mw->bound;
    Request req;
    req.opcode = w.hdr.opcode;
    req.wqe = &w;
    Response r;
    return send(eng, ctx, qp, req, nullptr, 0, nullptr, r) == SendResult::InFlight ? LocalOp::Posted
                                                                                    : LocalOp::Failed;
}

}  // namespace vrdma::shim
