// QueryDevice, QueryPort.
#include <cerrno>

#include "commands.h"
#include "device_model.h"

namespace vrdma::shim {

int cmd_query_device(Engine& eng, Context& ctx, const uint8_t*, uint8_t* resp) {
    store_resp(resp, eng.device_attr(ctx));
    return 0;
}

int cmd_query_port(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdQueryPortReq>(req);
    if (r.port_num != 1) return EINVAL;
    store_resp(resp, make_port_attr(ctx.guest()));
    return 0;
}

}  // namespace vrdma::shim
