// Memory windows, types 1 and 2B, with the semantics of the InfiniBand
// specification as Soft-RoCE (rxe) implements them (protocol.md "Memory
// windows"):
// - a window is bound to a range of one MR of its PD by a bind WQE on a QP of
//   that PD (ibv_bind_mw for type 1, IBV_WR_BIND_MW for type 2); the MR must
//   allow IBV_ACCESS_MW_BIND, and remote write or atomic access through the
//   window needs the MR's local write;
// - a type 1 window may be bound again (the binding is replaced) or unbound
//   (no MR, length 0); a type 2 window must be free to be bound, and is freed
//   by IBV_WR_LOCAL_INV or by a peer's Send with Invalidate;
// - a remote request through a window needs its current rkey, a target QP in
//   its PD and, for type 2, the very QP it was bound through, the access the
//   window grants, and a range inside it;
// - an MR with windows bound to it can neither be deregistered nor changed.
#pragma once

#include <cstdint>
#include <memory>

#include "context.h"
#include "resources.h"
#include "vrdma/abi.h"

namespace vrdma::shim {

// Executes the IBV_WR_BIND_MW WQE `w` posted on `qp`: IBV_WC_SUCCESS or
// IBV_WC_MW_BIND_ERR (nothing changed).
uint32_t bind_window(Context& ctx, const Qp& qp, const abi::SendWqe& w);
// IBV_WR_LOCAL_INV of `rkey` on `qp`: frees a bound type 2 window of the
// QP's PD. IBV_WC_SUCCESS or IBV_WC_LOC_QP_OP_ERR.
uint32_t invalidate_local(Context& ctx, const Qp& qp, uint32_t rkey);
// A Send with Invalidate of `rkey` arriving at `qp`: frees a bound type 2
// window of the QP's PD (`pd`: an XRC SRQ's, for an XRC_RECV QP) bound
// through this QP. False if there is none.
bool invalidate_remote(Context& ctx, const Qp& qp, uint32_t rkey);
bool invalidate_remote(Context& ctx, const Qp& qp, uint32_t pd, uint32_t rkey);
// Drops a window's binding (DeallocMw; the invalidations above).
void unbind_window(Context& ctx, Mw& mw);
// Remote access through the window `rkey` names, for a request arriving at
// `qp` whose keys are in PD `pd`: the shim's pointer to [addr, addr+len), or
// null if any check fails. `keep` (if given) gets the mapping that backs it.
uint8_t* resolve_window(const Context& ctx, const Qp& qp, uint32_t pd, uint32_t rkey, uint64_t addr, uint64_t len,
                        uint32_t access, const std::shared_ptr<Mapping>** keep);

}  // namespace vrdma::shim
