#include "hca_ud.h"

#include <cstring>

#include "context.h"
#include "engine.h"
#include "hca_device.h"
#include "responder.h"
#include "transport.h"
#include "vrdma_common/log.h"
#include "work_queue.h"

namespace vrdma::shim {
namespace {

// The guest that owns UD QP `qpn` of the device with GID `gid`: this
// shim's (this worker's, or another's), or a peer's as it announced.
bool datagram_source(const HcaDevice& dev, Engine& eng, const uint8_t* gid, uint32_t qpn, uint16_t& lid,
                     uint64_t& guid) {
    if (std::memcmp(gid, dev.gid(), 16) == 0) {
        QpRef ref = eng.qpns().find_by_qpn(qpn);
        if (!ref) return eng.shared().device_ud(qpn, lid, guid);
        if (ref.qp->type != IBV_QPT_UD) return false;
        lid = ref.ctx->guest().lid;
        guid = ref.ctx->guest().guid;
        return true;
    }
    return eng.ud_directory() && eng.ud_directory()->ud_owner(gid, qpn, lid, guid);
}

}  // namespace

bool parse_device_header(const uint8_t g[40], DeviceHeader& h) {
    if ((g[20] >> 4) == 4 && (g[20] & 0xf) == 5) {
        // IPv4: the source address as an IPv4-mapped GID.
        static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        std::memcpy(h.sgid, prefix, 12);
        std::memcpy(h.sgid + 12, g + 20 + 12, 4);
        h.traffic_class = g[21];
        h.hop_limit = g[20 + 8];
        return true;
    }
    if ((g[0] >> 4) == 6) {
        std::memcpy(h.sgid, g + 8, 16);
        h.traffic_class = uint8_t((g[0] << 4) | (g[1] >> 4));
        h.hop_limit = g[7];
        return true;
    }
    return false;
}

const uint8_t* hca_ud_destination(const HcaDevice& dev, Engine& eng, uint16_t dlid, uint32_t dqpn) {
    const Transport* t = eng.routes().lookup(dlid);
    if (!t) return nullptr;
    if (eng.is_here(t)) {
        QpRef d = eng.qpns().find(dlid, dqpn);
        return d && d.qp->type == IBV_QPT_UD && d.qp->carried ? dev.gid() : nullptr;
    }
    // A guest of another worker of this shim: its UD QPs of the default
    // partition are on the device, as a peer shim's are.
    if (t->within_shim()) return dev.gid();
    // A peer shim with a device has every UD QP of the default partition
    // on it, as this one does (a datagram to one that is not is lost there,
    // as it would be at its responder: another partition).
    return t->device_gid();
}

ibv_ah* hca_ud_ah(HcaDevice& dev, const Pd& pd, Ah& ah, const uint8_t* gid) {
    if (ah.kept && std::memcmp(dev_of(ah)->gid, gid, 16) == 0) return dev_of(ah)->ah;
    if (!pd.kept) return nullptr;
    int err = 0;
    std::unique_ptr<DeviceAh> d = dev.create_ah(shared_dev_of(pd), gid, ah.attr, err);
    if (!d) return nullptr;
    ah.kept.reset(d.release());
    return dev_of(ah)->ah;
}

void hca_ud_received(HcaDevice& dev, Engine& eng, Context& ctx, const Qp& qp, const ibv_wc& wc, const uint8_t* header,
                     const abi::Sge* sge, uint32_t nsge, abi::Cqe& c) {
    c.src_qp = wc.src_qp;
    c.slid = 0;
    c.sl = 0;  // a RoCE device does not carry it
    c.byte_len = wc.byte_len;
    DeviceHeader h;
    uint64_t src_guid = 0;
    Request g;  // the guest's GRH, as the shim's other paths write it (make_grh)
    if (!parse_device_header(header, h) || !datagram_source(dev, eng, h.sgid, wc.src_qp, g.slid, src_guid)) {
        // Logged at the 1st, 2nd, 4th, 8th...: anyone on the device's network
        // may send such datagrams (a program on the device directly).
        const uint64_t n = ++dev.stats().ud_unknown;
        if ((n & (n - 1)) == 0)
            LOG_WARN("guest %s: QP %u: a datagram from device QP %u that no shim announced: no source LID "
                     "(%llu so far)",
                     ctx.guest().name.c_str(), qp.qpn, wc.src_qp, (unsigned long long)n);
        return;
    }
    c.slid = g.slid;
    g.traffic_class = h.traffic_class;
    g.hop_limit = h.hop_limit;
    g.length = wc.byte_len >= HeaderSlots::kBytes ? wc.byte_len - HeaderSlots::kBytes : 0;
    make_gid(src_guid, g.sgid);
    make_gid(ctx.guest().guid, g.dgid);
    uint8_t grh[HeaderSlots::kBytes];
    make_grh(g, grh);
    // Into the guest's memory through the shim's mapping, as the local
    // transport writes it. A WQE the guest changed under the device (its
    // list no longer resolves) only loses the guest its own GRH.
    Span spans[abi::kMaxSge];
    uint32_t nspans = 0;
    uint64_t cap = 0;
    Span from{grh, sizeof(grh)};
    if (resolve_sges(ctx, qp.pd, sge, nsge, IBV_ACCESS_LOCAL_WRITE, spans, nspans, cap) != IBV_WC_SUCCESS ||
        cap < sizeof(grh) || copy_sg(spans, nspans, 0, &from, 1, sizeof(grh)) != CopyFault::None)
        return;
    // Every datagram through a RoCE device has a GRH: whether the sender's
    // AH was global does not travel with it.
    c.wc_flags |= IBV_WC_GRH;
}

}  // namespace vrdma::shim
