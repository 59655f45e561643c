#include "wire.h"

#include <infiniband/verbs.h>

#include <cstring>

#include "device_model.h"
#include "psn.h"

namespace vrdma::shim::fabric {

namespace {

bool gid_zero(const uint8_t g[16]) {
    uint64_t w[2];
    std::memcpy(w, g, 16);
    return (w[0] | w[1]) == 0;
}

// A Request or Response segment's: a fixed part on the first segment
// only. A request's extensions make four lengths (decode checks that its
// flags name the one it has).
bool fixed_len_ok(const SegHeader& h) {
    if (!(h.flags & kSegFirst)) return h.fixed_len == 0;
    if (h.type == uint8_t(SegType::Response)) return h.fixed_len == sizeof(WireResponse);
    for (int ext : {0, int(kReqOperands), int(kReqAddress), kReqOperands | kReqAddress})
        if (h.fixed_len == request_fixed_len(uint8_t(ext))) return true;
    return false;
}

}  // namespace

uint16_t encode(const Request& r, uint8_t out[kMaxFixed]) {
    WireRequest w{};
    w.opcode = uint16_t(r.opcode);
    w.qp_type = uint8_t(r.qp_type);
    w.pkey = r.pkey;
    w.sl = r.sl;
    w.imm = r.imm;
    w.rkey = r.rkey;
    // Only UD has a Q_Key; an RC request of an XRC_SEND QP carries the
    // target SRQ's number there (the XRCETH of IBA 9.8).
    w.qkey = r.qp_type == IBV_QPT_UD ? r.qkey : r.xrc_srqn;
    static_assert(kMaxMsgSize <= UINT32_MAX, "a request's length fits its 32 bits");
    w.length = uint32_t(r.length);  // the engine's requests are at most kMaxMsgSize (resolve_sges)
    w.remote_addr = r.remote_addr;
    w.src_incarnation = r.src_incarnation;
    w.dst_incarnation = r.dst_incarnation;
    w.flags = uint8_t((r.solicited ? kReqSolicited : 0) | (r.has_imm ? kReqImm : 0) | (r.grh ? kReqGrh : 0));
    // An extension goes only where it says something.
    if (r.compare_add || r.swap) w.flags |= kReqOperands;
    if (r.grh || r.traffic_class || r.hop_limit || r.flow_label || !gid_zero(r.sgid) || !gid_zero(r.dgid))
        w.flags |= kReqAddress;
    size_t at = sizeof(w);
    if (w.flags & kReqOperands) {
        const WireOperands o{r.compare_add, r.swap};
        std::memcpy(out + at, &o, sizeof(o));
        at += sizeof(o);
    }
    if (w.flags & kReqAddress) {
        WireAddress g{};
        g.traffic_class = r.traffic_class;
        g.hop_limit = r.hop_limit;
        g.flow_label = r.flow_label;
        std::memcpy(g.sgid, r.sgid, 16);
        std::memcpy(g.dgid, r.dgid, 16);
        std::memcpy(out + at, &g, sizeof(g));
        at += sizeof(g);
    }
    std::memcpy(out, &w, sizeof(w));
    return uint16_t(at);
}

bool decode(const SegHeader& h, const uint8_t* fixed, Request& r) {
    WireRequest w;
    std::memcpy(&w, fixed, sizeof(w));
    if ((w.flags & ~kReqFlagsKnown) || request_fixed_len(w.flags) != h.fixed_len || w.reserved) return false;
    if (w.qp_type != IBV_QPT_RC && w.qp_type != IBV_QPT_UD && w.qp_type != IBV_QPT_UC) return false;
    if (!is_request_opcode(w.opcode)) return false;
    if (is_tm_request(w.opcode) && w.qp_type != IBV_QPT_RC) return false;
    if (w.sl > 15 || w.length > kMaxMsgSize) return false;
    r = Request{};
    r.opcode = w.opcode;
    r.qp_type = w.qp_type;
    r.psn = h.psn;
    r.slid = h.src_lid;
    r.dlid = h.dst_lid;
    r.sqpn = h.src_qpn;
    r.dqpn = h.dst_qpn;
    r.sl = w.sl;
    r.solicited = (w.flags & kReqSolicited) != 0;
    r.has_imm = (w.flags & kReqImm) != 0;
    r.grh = (w.flags & kReqGrh) != 0;
    r.imm = w.imm;
    r.length = w.length;
    r.rkey = w.rkey;
    if (w.qp_type == IBV_QPT_UD)
        r.qkey = w.qkey;
    else
        r.xrc_srqn = w.qkey;
    r.remote_addr = w.remote_addr;
    r.pkey = w.pkey;
    r.src_incarnation = w.src_incarnation;
    r.dst_incarnation = w.dst_incarnation;
    size_t at = sizeof(w);
    if (w.flags & kReqOperands) {
        WireOperands o;
        std::memcpy(&o, fixed + at, sizeof(o));
        at += sizeof(o);
        r.compare_add = o.compare_add;
        r.swap = o.swap;
    }
    if (w.flags & kReqAddress) {
        WireAddress g;
        std::memcpy(&g, fixed + at, sizeof(g));
        if (g.reserved) return false;
        r.traffic_class = g.traffic_class;
        r.hop_limit = g.hop_limit;
        r.flow_label = g.flow_label & 0xfffff;
        std::memcpy(r.sgid, g.sgid, 16);
        std::memcpy(r.dgid, g.dgid, 16);
    }
    return true;
}

WireResponse encode(const Response& r, uint64_t length) {
    WireResponse w{};
    w.syndrome = uint8_t(r.syndrome);
    w.rnr_timer = r.rnr_timer;
    w.flags = r.tm ? kRespTm : 0;
    w.psn = r.psn;
    w.atomic_orig = r.atomic_orig;
    w.length = length;
    w.incarnation = r.incarnation;
    return w;
}

bool decode(const WireResponse& w, Response& r, uint64_t& length) {
    if (w.syndrome > kSyndromeMax || w.rnr_timer > 31 || w.psn > kPsnMask || w.length > kMaxMsgSize) return false;
    if (w.flags & ~kRespTm) return false;
    r.tm = (w.flags & kRespTm) != 0;
    r.syndrome = Syndrome(w.syndrome);
    r.rnr_timer = w.rnr_timer;
    r.psn = w.psn;
    r.atomic_orig = w.atomic_orig;
    r.incarnation = w.incarnation;
    length = w.length;
    return true;
}

bool header_ok(const SegHeader& h, const char** why) {
    auto bad = [&](const char* w) {
        *why = w;
        return false;
    };
    if (h.type < uint8_t(SegType::Request) || h.type > uint8_t(SegType::Cm)) return bad("unknown segment type");
    if (h.flags & ~(kSegFirst | kSegLast | kSegAbort)) return bad("unknown segment flags");
    if ((h.flags & kSegAbort) && (h.flags != (kSegLast | kSegAbort) || h.payload_len != 0))
        return bad("an abort flag on a segment that is not a message's empty last one");
    if (h.payload_len > kMaxSegmentPayload) return bad("segment payload over 64 KiB");
    if (h.type == uint8_t(SegType::Error)) return h.fixed_len == 0 ? true : bad("error segment with a fixed part");
    if (h.type == uint8_t(SegType::QpGone))
        return h.flags == (kSegFirst | kSegLast) && h.fixed_len == 0 && h.payload_len == 0 && h.offset == 0
                   ? true
                   : bad("malformed QP-gone notice");
    if (h.type == uint8_t(SegType::UdQp))
        return h.flags == (kSegFirst | kSegLast) && h.fixed_len == 0 && h.payload_len == 0 && h.src_qpn <= kPsnMask
                   ? true
                   : bad("malformed UD QP notice");
    if (h.type == uint8_t(SegType::Partitions))
        return h.flags == (kSegFirst | kSegLast) && h.fixed_len == 0 && h.payload_len >= 2 &&
                       h.payload_len <= 2 * kMaxPkeys && h.payload_len % 2 == 0 && h.offset == 0
                   ? true
                   : bad("malformed partition announcement");
    if (h.type == uint8_t(SegType::Cm))
        return h.flags == (kSegFirst | kSegLast) && h.fixed_len == 0 && h.payload_len >= 1 &&
                       h.payload_len <= kMaxCmPayload && h.offset == 0
                   ? true
                   : bad("malformed rdma_cm message");
    if (!fixed_len_ok(h)) return bad("wrong fixed part length");
    if (h.src_qpn > kPsnMask || h.dst_qpn > kPsnMask || h.psn > kPsnMask) return bad("QPN or PSN over 24 bits");
    if (h.offset > kMaxMsgSize) return bad("offset over the maximum message size");
    return true;
}

}  // namespace vrdma::shim::fabric
