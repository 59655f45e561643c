// ibv_attach_mcast and ibv_detach_mcast: the shim keeps the groups
// (docs/protocol.md "Multicast").
#include <cstring>

#include "context.h"
#include "objects.h"
#include "verbs.h"

namespace vrdma::prov {
namespace {

int mcast_command(ibv_qp* ibqp, const ibv_gid* gid, uint16_t lid, abi::CmdOp op) {
    if (!gid) return EINVAL;
    Qp* qp = to_qp(ibqp);
    abi::CmdMcastReq req{};
    req.qp_handle = qp->handle;
    req.lid = lid;
    std::memcpy(req.gid, gid->raw, sizeof(req.gid));
    return command(*qp->ctx, op, &req, sizeof(req), nullptr, 0);
}

}  // namespace

int attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
    return mcast_command(qp, gid, lid, abi::CmdOp::AttachMcast);
}

int detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
    return mcast_command(qp, gid, lid, abi::CmdOp::DetachMcast);
}

}  // namespace vrdma::prov
