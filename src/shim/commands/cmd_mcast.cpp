// AttachMcast, DetachMcast: a UD QP joins or leaves a multicast group
// (multicast_groups.h). Only UD QPs take multicast, as in IB; the MLID the
// caller gives must be a multicast LID, as the kernel checks on an IB
// port, but the group's own is derived from its MGID (mlid_of). A
// shim with an RDMA device (--hca) offers none: its UD QPs receive on the
// device, where the shim's copies cannot reach them (the device reports
// max_mcast_grp 0 there).
#include <infiniband/verbs.h>

#include <cerrno>

#include "commands.h"
#include "multicast_groups.h"

namespace vrdma::shim {
namespace {

int mcast_command(Engine& eng, Context& ctx, const uint8_t* req, bool attach) {
    auto r = load_req<abi::CmdMcastReq>(req);
    Qp* qp = ctx.qps.get(r.qp_handle);
    if (!qp) return ENOENT;
    // As the kernel (ib_attach_mcast) on an IB port: a multicast MLID too.
    if (qp->type != IBV_QPT_UD || !is_multicast_gid(r.gid) || !is_multicast_lid(r.lid)) return EINVAL;
    if (attach && eng.device_attr(ctx).max_mcast_grp == 0) return EOPNOTSUPP;  // a transport holds UD receives
    MulticastGroups& groups = eng.shared().multicast();
    const uint16_t lid = ctx.guest().lid;
    return attach ? groups.attach(lid, qp->qpn, r.gid) : groups.detach(lid, qp->qpn, r.gid);
}

}  // namespace

int cmd_attach_mcast(Engine& eng, Context& ctx, const uint8_t* req, uint8_t*) {
    return mcast_command(eng, ctx, req, true);
}

int cmd_detach_mcast(Engine& eng, Context& ctx, const uint8_t* req, uint8_t*) {
    return mcast_command(eng, ctx, req, false);
}

}  // namespace vrdma::shim
