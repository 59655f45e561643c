#include <cerrno>
#include <cstddef>
#include <type_traits>

#include "commands.h"
#include "vrdma/ring.h"

namespace vrdma::shim {
namespace {

// A command that reads no request record, or writes no response record.
struct NoRecord {};

template <typename T>
constexpr size_t record_size() {
    if constexpr (std::is_same_v<T, NoRecord>) return 0;
    else return sizeof(T);
}

// One entry of the command table: the request and response types are named
// here once, and their sizes checked against the slot at compile time.
template <typename Req, typename Resp>
consteval CommandSpec command(abi::CmdOp op, const char* name, CmdHandler handler) {
    static_assert(record_size<Req>() <= abi::kCmdReqBytes, "request record larger than CmdSlot::req");
    static_assert(record_size<Resp>() <= abi::kCmdRespBytes, "response record larger than CmdSlot::resp");
    return CommandSpec{op, name, handler, record_size<Req>(), record_size<Resp>()};
}

using abi::CmdOp;

// The one list of commands: op, log name, handler, request and response.
// The order does not matter; lookups go by op (kIndexByOp below).
constexpr CommandSpec kCommands[] = {
    command<NoRecord, abi::DeviceAttr>(CmdOp::QueryDevice, "QueryDevice", cmd_query_device),
    command<abi::CmdQueryPortReq, abi::PortAttr>(CmdOp::QueryPort, "QueryPort", cmd_query_port),
    command<NoRecord, abi::CmdAllocPdResp>(CmdOp::AllocPd, "AllocPd", cmd_alloc_pd),
    command<abi::CmdHandleReq, NoRecord>(CmdOp::DeallocPd, "DeallocPd", cmd_dealloc_pd),
    command<abi::CmdRegMrReq, abi::CmdRegMrResp>(CmdOp::RegMr, "RegMr", cmd_reg_mr),
    command<abi::CmdHandleReq, NoRecord>(CmdOp::DeregMr, "DeregMr", cmd_dereg_mr),
    command<abi::CmdCreateCqReq, abi::CmdCreateCqResp>(CmdOp::CreateCq, "CreateCq", cmd_create_cq),
    command<abi::CmdHandleReq, abi::CmdDestroyResp>(CmdOp::DestroyCq, "DestroyCq", cmd_destroy_cq),
    command<abi::CmdCreateQpReq, abi::CmdCreateQpResp>(CmdOp::CreateQp, "CreateQp", cmd_create_qp),
    command<abi::CmdModifyQpReq, NoRecord>(CmdOp::ModifyQp, "ModifyQp", cmd_modify_qp),
    command<abi::CmdHandleReq, abi::CmdQueryQpResp>(CmdOp::QueryQp, "QueryQp", cmd_query_qp),
    command<abi::CmdHandleReq, abi::CmdDestroyResp>(CmdOp::DestroyQp, "DestroyQp", cmd_destroy_qp),
    command<abi::CmdCreateSrqReq, abi::CmdCreateSrqResp>(CmdOp::CreateSrq, "CreateSrq", cmd_create_srq),
    command<abi::CmdModifySrqReq, NoRecord>(CmdOp::ModifySrq, "ModifySrq", cmd_modify_srq),
    command<abi::CmdHandleReq, abi::CmdQuerySrqResp>(CmdOp::QuerySrq, "QuerySrq", cmd_query_srq),
    command<abi::CmdHandleReq, abi::CmdDestroyResp>(CmdOp::DestroySrq, "DestroySrq", cmd_destroy_srq),
    command<abi::CmdCreateAhReq, abi::CmdCreateAhResp>(CmdOp::CreateAh, "CreateAh", cmd_create_ah),
    command<abi::CmdHandleReq, NoRecord>(CmdOp::DestroyAh, "DestroyAh", cmd_destroy_ah),
    command<abi::CmdResizeCqReq, abi::CmdResizeCqResp>(CmdOp::ResizeCq, "ResizeCq", cmd_resize_cq),
    command<abi::CmdReregMrReq, abi::CmdReregMrResp>(CmdOp::ReregMr, "ReregMr", cmd_rereg_mr),
    command<abi::CmdAllocMwReq, abi::CmdAllocMwResp>(CmdOp::AllocMw, "AllocMw", cmd_alloc_mw),
    command<abi::CmdHandleReq, NoRecord>(CmdOp::DeallocMw, "DeallocMw", cmd_dealloc_mw),
    command<NoRecord, abi::CmdOpenXrcdResp>(CmdOp::OpenXrcd, "OpenXrcd", cmd_open_xrcd),
    command<abi::CmdHandleReq, NoRecord>(CmdOp::CloseXrcd, "CloseXrcd", cmd_close_xrcd),
    command<abi::CmdMcastReq, NoRecord>(CmdOp::AttachMcast, "AttachMcast", cmd_attach_mcast),
    command<abi::CmdMcastReq, NoRecord>(CmdOp::DetachMcast, "DetachMcast", cmd_detach_mcast),
    command<abi::CmdTmOpReq, abi::CmdTmOpResp>(CmdOp::TmOp, "TmOp", cmd_tm_op),
};
constexpr uint32_t kOps = uint32_t(CmdOp::kMax);
constexpr size_t kCommandCount = sizeof(kCommands) / sizeof(kCommands[0]);

consteval bool every_op_exactly_once() {
    for (const CommandSpec& c : kCommands)
        // (No check of c.handler here: comparing a function address is not a
        // constant expression under -fsanitize with GCC 12. Every entry is
        // built by command(), which takes the handler by name.)
        if (uint32_t(c.op) == 0 || uint32_t(c.op) >= kOps || !c.name || !*c.name) return false;
    for (uint32_t op = 1; op < kOps; ++op) {
        int n = 0;
        for (const CommandSpec& c : kCommands) n += uint32_t(c.op) == op;
        if (n != 1) return false;
    }
    return true;
}
static_assert(every_op_exactly_once(), "kCommands must name every CmdOp in [1, kMax) exactly once");

// kIndexByOp[op]: the entry of kCommands for op (op 0: none, never read).
constexpr auto kIndexByOp = [] {
    struct Index {
        uint8_t at[kOps] = {};
    } idx;
    for (size_t i = 0; i < kCommandCount; ++i) idx.at[uint32_t(kCommands[i].op)] = uint8_t(i);
    return idx;
}();
static_assert(kCommandCount < 256);

}  // namespace

std::span<const CommandSpec> command_table() { return kCommands; }

const CommandSpec* find_command(uint32_t op) {
    if (op == 0 || op >= kOps) return nullptr;
    return &kCommands[kIndexByOp.at[op]];
}

const char* command_name(uint32_t op) {
    const CommandSpec* c = find_command(op);
    return c ? c->name : "unknown";
}

int dispatch_command(Engine& eng, Context& ctx, uint32_t op, const uint8_t* req, uint8_t* resp) {
    const CommandSpec* c = find_command(op);
    if (!c) return EOPNOTSUPP;
    return c->handler(eng, ctx, req, resp);
}

int map_ring(const Context& ctx, uint64_t gva, uint64_t bytes, HostRange& out) {
    if (gva == 0 || gva % abi::kCacheLine || bytes == 0) return EINVAL;
    return ctx.segments.translate_ring(gva, bytes, out);
}

bool wq_geometry_ok(uint32_t entries, uint32_t limit, uint32_t stride, uint64_t min_stride) {
    return is_pow2(entries) && entries <= limit && is_pow2(stride) && stride >= abi::kMinWqeStride &&
           stride <= abi::kMaxWqeStride && stride >= min_stride;
}

}  // namespace vrdma::shim
