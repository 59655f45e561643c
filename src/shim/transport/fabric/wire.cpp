#include "wire.h"

#include <infiniband/verbs.h>

#include <cstring>

#include "device_model.h"
#include "psn.h"

namespace vrdma::shim::fabric {

WireRequest encode(const Request& r) {
    WireRequest w{};
    w.opcode = r.opcode;
    w.qp_type = r.qp_type;
    w.psn = r.psn;
    w.slid = r.slid;
    w.dlid = r.dlid;
    w.sqpn = r.sqpn;
    w.dqpn = r.dqpn;
    w.sl = r.sl;
    w.solicited = r.solicited;
    w.has_imm = r.has_imm;
    w.grh = r.grh;
    w.imm = r.imm;
    w.length = r.length;
    w.rkey = r.rkey;
    // Only UD has a Q_Key; an RC request of an XRC_SEND QP carries the
    // target SRQ's number there (the XRCETH of IBA 9.8).
    w.qkey = r.qp_type == IBV_QPT_UD ? r.qkey : r.xrc_srqn;
    w.remote_addr = r.remote_addr;
    w.compare_add = r.compare_add;
    w.swap = r.swap;
    w.traffic_class = r.traffic_class;
    w.hop_limit = r.hop_limit;
    w.flow_label = r.flow_label;
    w.pkey = r.pkey;
    w.src_incarnation = r.src_incarnation;
    w.dst_incarnation = r.dst_incarnation;
    std::memcpy(w.sgid, r.sgid, 16);
    std::memcpy(w.dgid, r.dgid, 16);
    return w;
}

bool decode(const WireRequest& w, Request& r) {
    if (w.qp_type != IBV_QPT_RC && w.qp_type != IBV_QPT_UD && w.qp_type != IBV_QPT_UC) return false;
    if (!is_request_opcode(w.opcode)) return false;
    if (is_tm_request(w.opcode) && w.qp_type != IBV_QPT_RC) return false;
    if (w.psn > kPsnMask || w.sqpn > kPsnMask || w.dqpn > kPsnMask) return false;
    if (w.sl > 15 || w.solicited > 1 || w.has_imm > 1 || w.grh > 1) return false;
    if (w.length > kMaxMsgSize) return false;
    r = Request{};
    r.opcode = w.opcode;
    r.qp_type = w.qp_type;
    r.psn = w.psn;
    r.slid = w.slid;
    r.dlid = w.dlid;
    r.sqpn = w.sqpn;
    r.dqpn = w.dqpn;
    r.sl = w.sl;
    r.solicited = w.solicited;
    r.has_imm = w.has_imm;
    r.grh = w.grh;
    r.imm = w.imm;
    r.length = w.length;
    r.rkey = w.rkey;
    if (w.qp_type == IBV_QPT_UD)
        r.qkey = w.qkey;
    else
        r.xrc_srqn = w.qkey;
    r.remote_addr = w.remote_addr;
    r.compare_add = w.compare_add;
    r.swap = w.swap;
    r.traffic_class = w.traffic_class;
    r.hop_limit = w.hop_limit;
    r.flow_label = w.flow_label & 0xfffff;
    r.pkey = w.pkey;
    r.src_incarnation = w.src_incarnation;
    r.dst_incarnation = w.dst_incarnation;
    std::memcpy(r.sgid, w.sgid, 16);
    std::memcpy(r.dgid, w.dgid, 16);
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
    const size_t want = h.type == uint8_t(SegType::Request) ? sizeof(WireRequest) : sizeof(WireResponse);
    if ((h.flags & kSegFirst) ? h.fixed_len != want : h.fixed_len != 0) return bad("wrong fixed part length");
    if (h.src_qpn > kPsnMask || h.dst_qpn > kPsnMask || h.psn > kPsnMask) return bad("QPN or PSN over 24 bits");
    if (h.offset > kMaxMsgSize) return bad("offset over the maximum message size");
    return true;
}

}  // namespace vrdma::shim::fabric
