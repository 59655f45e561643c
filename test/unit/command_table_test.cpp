// The command table (command_dispatch.cpp): every CmdOp reaches its own
// handler under its own name, with the record sizes of its ABI types, and
// an unknown op reaches none.
#include <catch2/catch.hpp>
#include <cstring>
#include <set>
#include <string>

#include "commands.h"
#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using abi::CmdOp;

namespace {

// Written out independently of the table under test: op, name, handler,
// request and response record sizes (0: none).
struct Expected {
    CmdOp op;
    const char* name;
    CmdHandler handler;
    size_t req, resp;
};
const Expected kExpected[] = {
    {CmdOp::QueryDevice, "QueryDevice", cmd_query_device, 0, sizeof(abi::DeviceAttr)},
    {CmdOp::QueryPort, "QueryPort", cmd_query_port, sizeof(abi::CmdQueryPortReq), sizeof(abi::PortAttr)},
    {CmdOp::AllocPd, "AllocPd", cmd_alloc_pd, 0, sizeof(abi::CmdAllocPdResp)},
    {CmdOp::DeallocPd, "DeallocPd", cmd_dealloc_pd, sizeof(abi::CmdHandleReq), 0},
    {CmdOp::RegMr, "RegMr", cmd_reg_mr, sizeof(abi::CmdRegMrReq), sizeof(abi::CmdRegMrResp)},
    {CmdOp::DeregMr, "DeregMr", cmd_dereg_mr, sizeof(abi::CmdHandleReq), 0},
    {CmdOp::CreateCq, "CreateCq", cmd_create_cq, sizeof(abi::CmdCreateCqReq), sizeof(abi::CmdCreateCqResp)},
    {CmdOp::DestroyCq, "DestroyCq", cmd_destroy_cq, sizeof(abi::CmdHandleReq), sizeof(abi::CmdDestroyResp)},
    {CmdOp::CreateQp, "CreateQp", cmd_create_qp, sizeof(abi::CmdCreateQpReq), sizeof(abi::CmdCreateQpResp)},
    {CmdOp::ModifyQp, "ModifyQp", cmd_modify_qp, sizeof(abi::CmdModifyQpReq), 0},
    {CmdOp::QueryQp, "QueryQp", cmd_query_qp, sizeof(abi::CmdHandleReq), sizeof(abi::CmdQueryQpResp)},
    {CmdOp::DestroyQp, "DestroyQp", cmd_destroy_qp, sizeof(abi::CmdHandleReq), sizeof(abi::CmdDestroyResp)},
    {CmdOp::CreateSrq, "CreateSrq", cmd_create_srq, sizeof(abi::CmdCreateSrqReq), sizeof(abi::CmdCreateSrqResp)},
    {CmdOp::ModifySrq, "ModifySrq", cmd_modify_srq, sizeof(abi::CmdModifySrqReq), 0},
    {CmdOp::QuerySrq, "QuerySrq", cmd_query_srq, sizeof(abi::CmdHandleReq), sizeof(abi::CmdQuerySrqResp)},
    {CmdOp::DestroySrq, "DestroySrq", cmd_destroy_srq, sizeof(abi::CmdHandleReq), sizeof(abi::CmdDestroyResp)},
    {CmdOp::CreateAh, "CreateAh", cmd_create_ah, sizeof(abi::CmdCreateAhReq), sizeof(abi::CmdCreateAhResp)},
    {CmdOp::DestroyAh, "DestroyAh", cmd_destroy_ah, sizeof(abi::CmdHandleReq), 0},
    {CmdOp::ResizeCq, "ResizeCq", cmd_resize_cq, sizeof(abi::CmdResizeCqReq), sizeof(abi::CmdResizeCqResp)},
    {CmdOp::ReregMr, "ReregMr", cmd_rereg_mr, sizeof(abi::CmdReregMrReq), sizeof(abi::CmdReregMrResp)},
    {CmdOp::AllocMw, "AllocMw", cmd_alloc_mw, sizeof(abi::CmdAllocMwReq), sizeof(abi::CmdAllocMwResp)},
    {CmdOp::DeallocMw, "DeallocMw", cmd_dealloc_mw, sizeof(abi::CmdHandleReq), 0},
    {CmdOp::OpenXrcd, "OpenXrcd", cmd_open_xrcd, 0, sizeof(abi::CmdOpenXrcdResp)},
    {CmdOp::CloseXrcd, "CloseXrcd", cmd_close_xrcd, sizeof(abi::CmdHandleReq), 0},
    {CmdOp::AttachMcast, "AttachMcast", cmd_attach_mcast, sizeof(abi::CmdMcastReq), 0},
    {CmdOp::DetachMcast, "DetachMcast", cmd_detach_mcast, sizeof(abi::CmdMcastReq), 0},
    {CmdOp::TmOp, "TmOp", cmd_tm_op, sizeof(abi::CmdTmOpReq), sizeof(abi::CmdTmOpResp)},
};

}  // namespace

TEST_CASE("the command table routes every op to its own handler and name", "[shim][commands]") {
    REQUIRE(std::size(kExpected) == uint32_t(CmdOp::kMax) - 1);
    REQUIRE(command_table().size() == std::size(kExpected));
    std::set<std::string> names;
    for (const Expected& e : kExpected) {
        INFO("op " << uint32_t(e.op) << " (" << e.name << ")");
        const CommandSpec* c = find_command(uint32_t(e.op));
        REQUIRE(c != nullptr);
        CHECK(c->op == e.op);
        CHECK(std::string(c->name) == e.name);
        CHECK(std::string(command_name(uint32_t(e.op))) == e.name);
        CHECK(c->handler == e.handler);
        CHECK(c->req_size == e.req);
        CHECK(c->resp_size == e.resp);
        CHECK(c->req_size <= abi::kCmdReqBytes);
        CHECK(c->resp_size <= abi::kCmdRespBytes);
        names.insert(c->name);
    }
    CHECK(names.size() == std::size(kExpected));  // no two ops share a name
}

TEST_CASE("unknown ops have no entry, the name \"unknown\" and give EOPNOTSUPP", "[shim][commands]") {
    test::TwoGuests t;
    for (uint32_t op : {0u, uint32_t(CmdOp::kMax), uint32_t(CmdOp::kMax) + 1, 0x80000000u, 0xffffffffu}) {
        INFO("op " << op);
        CHECK(find_command(op) == nullptr);
        CHECK(std::string(command_name(op)) == "unknown");
        alignas(8) uint8_t req[abi::kCmdReqBytes] = {};
        alignas(8) uint8_t resp[abi::kCmdRespBytes] = {};
        CHECK(dispatch_command(t.eng, t.a.ctx(), op, req, resp) == EOPNOTSUPP);
    }
}

TEST_CASE("dispatch_command runs the handler of the op it is given", "[shim][commands]") {
    // Ops whose handlers answer distinguishably with an all-zero request:
    // QueryDevice fills DeviceAttr, AllocPd returns a handle, QueryPort
    // refuses port 0, the handle-taking ops refuse handle 0.
    test::TwoGuests t;
    alignas(8) uint8_t req[abi::kCmdReqBytes] = {};
    alignas(8) uint8_t resp[abi::kCmdRespBytes] = {};
    REQUIRE(dispatch_command(t.eng, t.a.ctx(), uint32_t(CmdOp::QueryDevice), req, resp) == 0);
    abi::DeviceAttr d;
    std::memcpy(&d, resp, sizeof(d));
    CHECK(d.phys_port_cnt == 1);
    std::memset(resp, 0, sizeof(resp));
    REQUIRE(dispatch_command(t.eng, t.a.ctx(), uint32_t(CmdOp::AllocPd), req, resp) == 0);
    abi::CmdAllocPdResp pd;
    std::memcpy(&pd, resp, sizeof(pd));
    CHECK(pd.pd_handle != abi::kInvalidHandle);
    CHECK(dispatch_command(t.eng, t.a.ctx(), uint32_t(CmdOp::QueryPort), req, resp) == EINVAL);
    for (CmdOp op : {CmdOp::DeregMr, CmdOp::DestroyCq, CmdOp::QueryQp, CmdOp::DestroyQp, CmdOp::QuerySrq,
                     CmdOp::DestroySrq, CmdOp::DestroyAh}) {
        INFO(command_name(uint32_t(op)));
        CHECK(dispatch_command(t.eng, t.a.ctx(), uint32_t(op), req, resp) != 0);
    }
}
