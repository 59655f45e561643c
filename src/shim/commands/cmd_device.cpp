// QueryDevice, QueryPort.
#include <cerrno>

#include "commands.h"
#include "device_model.h"

namespace vrdma::shim {

int cmd_query_device(Engine& eng, Context& ctx, const uint8_t*, uint8_t* resp) {
    abi::DeviceAttr a = make_device_attr(ctx.guest(), ctx.quotas());
    // Through an RDMA device, UD QPs receive on it: no multicast (cmd_mcast.cpp).
    // Nor tag matching (cmd_srq.cpp).
    if (eng.hca()) a.max_mcast_grp = a.max_mcast_qp_attach = a.max_total_mcast_qp_attach = a.max_tm_tags = 0;
    store_resp(resp, a);
    return 0;
}

int cmd_query_port(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdQueryPortReq>(req);
    if (r.port_num != 1) return EINVAL;
    store_resp(resp, make_port_attr(ctx.guest()));
    return 0;
}

}  // namespace vrdma::shim
