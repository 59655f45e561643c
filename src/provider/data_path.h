// Helpers shared by the two send paths (ibv_post_send and the ibv_qp_ex
// work-request API). No system calls, no allocation.
#pragma once

#include <infiniband/verbs.h>

#include <cstring>

#include "objects.h"
#include "vrdma/ring.h"

namespace vrdma::prov {

inline bool opcode_allowed(ibv_qp_type type, ibv_wr_opcode op) {
    if (type == IBV_QPT_XRC_SEND) type = IBV_QPT_RC;  // an RC requester, each message to an XRC SRQ
    switch (op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
        return true;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        return type == IBV_QPT_RC || type == IBV_QPT_UC;
    case IBV_WR_BIND_MW:
    case IBV_WR_LOCAL_INV:
        return type == IBV_QPT_RC || type == IBV_QPT_UC;
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_SEND_WITH_INV:  // no UC opcode carries an invalidation
        return type == IBV_QPT_RC;
    default:
        return false;
    }
}

inline bool inline_allowed(ibv_wr_opcode op) {
    return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV || op == IBV_WR_RDMA_WRITE ||
           op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

// Operations on the device's own tables: they carry no data (no SGEs).
inline bool is_local_op(ibv_wr_opcode op) { return op == IBV_WR_BIND_MW || op == IBV_WR_LOCAL_INV; }

// The fields of a bind WQE (abi::SendWqe). The shim checks the window, the
// MR and the range when the WQE runs.
inline void fill_bind(abi::SendWqe& w, const ibv_mw& mw, uint32_t rkey, const ibv_mw_bind_info& b) {
    w.mw_handle = mw.handle;
    w.rkey = rkey;
    w.mr_lkey = b.mr ? b.mr->lkey : 0;
    w.remote_addr = b.addr;
    w.compare_add = b.length;
    w.mw_access = b.mw_access_flags;
}

inline bool send_state_ok(ibv_qp_state s) {
    return s != IBV_QPS_RESET && s != IBV_QPS_INIT && s != IBV_QPS_RTR;
}

// Is there a free slot at `prod`? Refreshes *cons from the shim when needed.
// `*cons`: the consumer index known so far (start with wq.cons_seen; the
// shim's only ever moves forward from it), read again only when the ring
// looks full.
inline bool wq_has_room(WorkQueue& wq, uint32_t prod, uint32_t* cons) {
    if (!ring_full(prod, *cons, wq.entries) && ring_valid_consumer(*cons, prod, wq.entries)) return true;
    *cons = wq.cons_seen = wq.hdr->consumer.load(std::memory_order_acquire);
    return ring_valid_consumer(*cons, prod, wq.entries) && !ring_full(prod, *cons, wq.entries);
}

inline void wq_publish(Context& ctx, WorkQueue& wq, uint32_t prod) {
    wq.prod = prod;
    wq.hdr->producer.store(prod, std::memory_order_release);
    ring_work_slot(ctx, wq.work_slot);
}

}  // namespace vrdma::prov
