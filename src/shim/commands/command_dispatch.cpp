#include "commands.h"

#include <cerrno>

#include "vrdma/ring.h"

namespace vrdma::shim {
namespace {

constexpr CmdHandler kHandlers[] = {
    nullptr,          cmd_query_device, cmd_query_port,  cmd_alloc_pd,    cmd_dealloc_pd,  cmd_reg_mr,
    cmd_dereg_mr,     cmd_create_cq,    cmd_destroy_cq,  cmd_create_qp,   cmd_modify_qp,   cmd_query_qp,
    cmd_destroy_qp,   cmd_create_srq,   cmd_modify_srq,  cmd_query_srq,   cmd_destroy_srq, cmd_create_ah,
    cmd_destroy_ah,
};
static_assert(sizeof(kHandlers) / sizeof(kHandlers[0]) == uint32_t(abi::CmdOp::kMax));

}  // namespace

int dispatch_command(Engine& eng, Context& ctx, uint32_t op, const uint8_t* req, uint8_t* resp) {
    if (op == 0 || op >= uint32_t(abi::CmdOp::kMax)) return EOPNOTSUPP;
    return kHandlers[op](eng, ctx, req, resp);
}

int map_ring(const Context& ctx, uint64_t gva, uint64_t bytes, HostRange& out) {
    if (gva == 0 || gva % abi::kCacheLine || bytes == 0) return EINVAL;
    return ctx.segments.translate_one(gva, bytes, out);
}

bool wq_geometry_ok(uint32_t entries, uint32_t limit, uint32_t stride, uint64_t min_stride) {
    return is_pow2(entries) && entries <= limit && is_pow2(stride) && stride >= abi::kMinWqeStride &&
           stride <= abi::kMaxWqeStride && stride >= min_stride;
}

}  // namespace vrdma::shim
