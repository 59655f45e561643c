#include "work_queue.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstring>

#include "device_model.h"
#include "fault_guard.h"
#include "memory_windows.h"
#include "vrdma/ring.h"

namespace vrdma::shim {

bool wq_pending(WorkQueue& wq, uint32_t& count) {
    count = 0;
    if (wq.broken || !wq.ring) return false;
    uint32_t prod = wq.ring->producer.load(std::memory_order_acquire);
    if (!ring_valid_producer(prod, wq.cons, wq.entries)) {
        wq.broken = true;
        return false;
    }
    count = ring_count(prod, wq.cons, wq.entries);
    return true;
}

void wq_consume(WorkQueue& wq) {
    wq.cons = ring_next(wq.cons, wq.entries);
    wq.ring->consumer.store(wq.cons, std::memory_order_release);
}

void wq_reset(WorkQueue& wq) {
    if (!wq.ring) return;
    wq.cons = 0;
    wq.broken = false;
    wq.ring->consumer.store(0, std::memory_order_release);
}

void wq_discard_all(WorkQueue& wq) {
    if (!wq.ring) return;
    uint32_t prod = wq.ring->producer.load(std::memory_order_acquire);
    if (!ring_index_ok(prod, wq.entries)) {
        wq.broken = true;
        return;
    }
    wq.broken = false;
    wq.cons = prod;
    wq.ring->consumer.store(prod, std::memory_order_release);
}

uint32_t read_send_wqe(const WorkQueue& wq, uint32_t idx, uint32_t max_sge, uint32_t max_inline, SendWork& out) {
    const uint8_t* slot = wq.slot(idx);
    std::memcpy(&out.hdr, slot, sizeof(out.hdr));
    out.num_sge = 0;
    out.is_inline = (out.hdr.send_flags & IBV_SEND_INLINE) != 0;
    out.inline_len = 0;
    const uint64_t room = wq.stride - sizeof(abi::SendWqe);
    if (out.is_inline) {
        uint32_t len = out.hdr.inline_len;
        if (len > max_inline || len > room || len > abi::kMaxInline) return IBV_WC_LOC_LEN_ERR;
        std::memcpy(out.inline_data, slot + sizeof(abi::SendWqe), len);
        out.inline_len = len;
        return IBV_WC_SUCCESS;
    }
    uint32_t n = out.hdr.num_sge;
    if (n > max_sge || n > abi::kMaxSge || uint64_t(n) * sizeof(abi::Sge) > room) return IBV_WC_LOC_QP_OP_ERR;
    std::memcpy(out.sge, slot + sizeof(abi::SendWqe), n * sizeof(abi::Sge));
    out.num_sge = n;
    return IBV_WC_SUCCESS;
}

uint32_t read_recv_wqe(const WorkQueue& wq, uint32_t idx, uint32_t max_sge, RecvWork& out) {
    const uint8_t* slot = wq.slot(idx);
    abi::RecvWqe hdr;
    std::memcpy(&hdr, slot, sizeof(hdr));
    out.wr_id = hdr.wr_id;
    out.num_sge = 0;
    uint32_t n = hdr.num_sge;
    const uint64_t room = wq.stride - sizeof(abi::RecvWqe);
    if (n > max_sge || n > abi::kMaxSge || uint64_t(n) * sizeof(abi::Sge) > room) return IBV_WC_LOC_QP_OP_ERR;
    std::memcpy(out.sge, slot + sizeof(abi::RecvWqe), n * sizeof(abi::Sge));
    out.num_sge = n;
    return IBV_WC_SUCCESS;
}

uint32_t resolve_sges(const Context& ctx, uint32_t pd, const abi::Sge* sge, uint32_t num_sge, uint32_t access,
                      Span* out, uint32_t& spans, uint64_t& total, Pins* pins) {
    spans = 0;
    total = 0;
    for (uint32_t i = 0; i < num_sge; ++i) {
        const abi::Sge& s = sge[i];
        if (s.length == 0) continue;
        const Mr* mr = ctx.mrs.get(ctx.keys.lookup(s.lkey, KeyKind::Mr));
        if (!mr || mr->pd != pd || (mr->access & access) != access) return IBV_WC_LOC_PROT_ERR;
        if (!range_inside(s.addr, s.length, mr->addr, mr->length)) return IBV_WC_LOC_PROT_ERR;
        const std::shared_ptr<Mapping>* keep = nullptr;
        uint8_t* p = mr_bytes(ctx, *mr, s.addr, s.length, &keep);
        if (!p) return IBV_WC_LOC_PROT_ERR;
        out[spans++] = Span{p, s.length};
        if (pins) pins->add(*keep);
        total += s.length;
    }
    if (total > kMaxMsgSize) return IBV_WC_LOC_LEN_ERR;
    return IBV_WC_SUCCESS;
}

uint8_t* mr_bytes(const Context& ctx, const Mr& mr, uint64_t addr, uint64_t len,
                  const std::shared_ptr<Mapping>** keep) {
    if (!mr.on_demand) {
        if (keep) *keep = &mr.mem.keepalive;
        return mr.mem.host + (addr - mr.addr);
    }
    if (const SegmentTable::Piece* piece = ctx.segments.find_within_one(addr, len)) {
        if (keep) *keep = &piece->map;
        return piece->map->base + (addr - piece->map->gva);
    }
    // Over several segments (the guest's faults shared it in parts): one
    // mapping composed of them, kept with the MR for the next access.
    for (const HostRange& c : mr.composed) {
        const Mapping& m = *c.keepalive;
        if (range_inside(addr, len, m.gva, m.len)) {
            if (keep) *keep = &c.keepalive;
            return m.base + (addr - m.gva);
        }
    }
    // At most kMaxComposed per MR, kept until it goes: each costs system
    // calls on the worker, so their number, not a cache's turnover, bounds
    // that work (and the guest's mapping quota bounds them all).
    if (mr.composed.size() >= Mr::kMaxComposed) return nullptr;
    HostRange r;
    if (ctx.segments.map_range(addr, len, r, ctx.charges.usage()) != 0) return nullptr;
    mr.composed.push_back(std::move(r));
    if (keep) *keep = &mr.composed.back().keepalive;
    return mr.composed.back().host;
}

uint8_t* resolve_rkey(const Context& ctx, const Qp& qp, uint32_t pd, uint32_t rkey, uint64_t addr, uint64_t len,
                      uint32_t access, const std::shared_ptr<Mapping>** keep) {
    const uint32_t handle = ctx.keys.lookup(rkey, KeyKind::Mr);
    if (!handle) return resolve_window(ctx, qp, pd, rkey, addr, len, access, keep);
    Mr* mr = ctx.mrs.get(handle);
    if (!mr || mr->pd != pd || (mr->access & access) != access) return nullptr;
    if (!range_inside(addr, len, mr->addr, mr->length)) return nullptr;
    return mr_bytes(ctx, *mr, addr, len, keep);
}

bool Pins::fragile() const {
    for (uint32_t i = 0; i < count; ++i)
        if (!keep[i] || !keep[i]->ring_safe) return true;
    return false;
}

CopyFault copy_sg(const Span* dst, uint32_t nd, uint64_t dst_skip, const Span* src, uint32_t ns, uint64_t src_skip,
                  uint64_t bytes) {
    uint32_t di = 0, si = 0;
    uint64_t doff = dst_skip, soff = src_skip;
    while (di < nd && doff >= dst[di].len) doff -= dst[di++].len;
    while (si < ns && soff >= src[si].len) soff -= src[si++].len;
    while (bytes > 0 && di < nd && si < ns) {
        uint64_t n = std::min({bytes, dst[di].len - doff, src[si].len - soff});
        uintptr_t at = 0;
        if (!guarded_memmove(dst[di].p + doff, src[si].p + soff, n, &at)) {
            uintptr_t d0 = uintptr_t(dst[di].p + doff);
            return at >= d0 && at - d0 < n ? CopyFault::Dst : CopyFault::Src;
        }
        bytes -= n;
        doff += n;
        soff += n;
        if (doff == dst[di].len) ++di, doff = 0;
        if (soff == src[si].len) ++si, soff = 0;
    }
    return CopyFault::None;
}

}  // namespace vrdma::shim
