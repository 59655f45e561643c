// Reading work queues the guest produces: validated producer indices, WQEs
// copied into private memory before any field is looked at, and SGEs
// resolved (lkey, PD, access, bounds) into shim pointers.
#pragma once

#include <cstdint>
#include <memory>

#include "context.h"
#include "resources.h"
#include "vrdma/abi.h"

namespace vrdma::shim {


// Number of WQEs posted and not yet consumed. Returns false (and marks the
// queue broken) if the guest wrote an invalid producer index.
bool wq_pending(WorkQueue& wq, uint32_t& count);
// Consumes the WQE at the consumer index and publishes the new index.
void wq_consume(WorkQueue& wq);
// Sets the consumer index to 0 (a new queue).
void wq_reset(WorkQueue& wq);
// Drops every posted WQE without completing it (QP to RESET): the consumer
// index moves up to the producer's. Indices keep running across RESET; the
// provider does not reset its producer index.
void wq_discard_all(WorkQueue& wq);

struct Span {
    uint8_t* p;
    uint64_t len;
};

// Mappings an asynchronous transport keeps alive while a payload moves over
// several turns (the guest may deregister the memory meanwhile: the bytes
// then land in pages nobody uses any more, never in unmapped memory).
struct Pins {
    std::shared_ptr<Mapping> keep[abi::kMaxSge];
    uint32_t count = 0;
    void add(const std::shared_ptr<Mapping>& m) {
        if (count < abi::kMaxSge) keep[count++] = m;
    }
    // Moves every pin of `from` into this one (from is left empty).
    void take(Pins& from) {
        for (uint32_t i = 0; i < from.count; ++i)
            if (count < abi::kMaxSge) keep[count++] = std::move(from.keep[i]);
        from.clear();
    }
    // Whether any of this memory is a file the guest may truncate under the
    // shim (not a sealed memfd: segment_table.h), so that reading it can fail.
    bool fragile() const;
    void clear() {
        for (uint32_t i = 0; i < count; ++i) keep[i].reset();
        count = 0;
    }
};

struct SendWork {
    abi::SendWqe hdr;
    abi::Sge sge[abi::kMaxSge];
    uint32_t num_sge = 0;
    bool is_inline = false;
    uint32_t inline_len = 0;
    alignas(16) uint8_t inline_data[abi::kMaxInline];
};

struct RecvWork {
    uint64_t wr_id = 0;
    uint32_t num_sge = 0;
    abi::Sge sge[abi::kMaxSge];
};

// Copies the send WQE at `idx` out of the ring and checks its structure
// (SGE count, inline length) against the QP's limits and the stride.
// Returns IBV_WC_SUCCESS or the error status its completion must carry;
// hdr.wr_id and hdr.opcode are always filled.
uint32_t read_send_wqe(const WorkQueue& wq, uint32_t idx, uint32_t max_sge, uint32_t max_inline, SendWork& out);
uint32_t read_recv_wqe(const WorkQueue& wq, uint32_t idx, uint32_t max_sge, RecvWork& out);

// Resolves SGEs of `ctx` for a QP in `pd`: lkey names a live MR of that PD
// with the `access` flags (IBV_ACCESS_LOCAL_WRITE when the shim writes),
// range inside the MR. Zero-length SGEs are skipped. Returns
// IBV_WC_SUCCESS, IBV_WC_LOC_PROT_ERR or IBV_WC_LOC_LEN_ERR (total over the
// maximum message size). `out` needs num_sge entries; `spans` gets the count.
// `pins` (if given) keeps every span's mapping alive (responder.h).
uint32_t resolve_sges(const Context& ctx, uint32_t pd, const abi::Sge* sge, uint32_t num_sge, uint32_t access,
                      Span* out, uint32_t& spans, uint64_t& total, Pins* pins = nullptr);

// Resolves a remote key for a request arriving at `qp`: an MR of `ctx` in
// PD `pd` (the QP's, or an XRC SRQ's) with `access`, or a memory window (memory_windows.h), covering
// [addr, addr+len). Null if any check fails. `keep` (if given) gets the
// mapping that backs the range.
uint8_t* resolve_rkey(const Context& ctx, const Qp& qp, uint32_t pd, uint32_t rkey, uint64_t addr, uint64_t len,
                      uint32_t access, const std::shared_ptr<Mapping>** keep = nullptr);

// The shim's bytes for [addr, addr+len) of `mr` (the caller has checked
// the range is inside it): its mapping, or for an MR served on demand the
// segment that holds the whole range now (null if none: never faulted in,
// or split over two segments). `keep` (if given) gets the mapping.
uint8_t* mr_bytes(const Context& ctx, const Mr& mr, uint64_t addr, uint64_t len,
                  const std::shared_ptr<Mapping>** keep = nullptr);

// Which side of a copy_sg lost a page under it (fault_guard.h).
enum class CopyFault { None, Dst, Src };

// Copies `bytes` from the gather list to the scatter list, skipping the
// first `dst_skip` bytes of the scatter list (and `src_skip` of the gather
// list). One guarded memmove per piece; a page the guest took away (a
// truncated file) stops the copy and says which side it was on. The caller
// has checked that both lists are long enough.
CopyFault copy_sg(const Span* dst, uint32_t nd, uint64_t dst_skip, const Span* src, uint32_t ns, uint64_t src_skip,
                  uint64_t bytes);
inline CopyFault copy_sg(const Span* dst, uint32_t nd, uint64_t dst_skip, const Span* src, uint32_t ns,
                         uint64_t bytes) {
    return copy_sg(dst, nd, dst_skip, src, ns, 0, bytes);
}

}  // namespace vrdma::shim
