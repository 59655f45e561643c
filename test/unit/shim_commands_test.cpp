// Command validation: every field of every command against bad values.
#include <catch2/catch.hpp>

#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;
using abi::CmdOp;

TEST_CASE("device and port queries report the enforced limits", "[shim][commands]") {
    TwoGuests t;
    auto r = t.a.cmd(CmdOp::QueryDevice);
    REQUIRE(r.status == 0);
    auto d = r.as<abi::DeviceAttr>();
    CHECK(d.max_qp == 16384);
    CHECK(d.max_qp_wr == 16384);
    CHECK(d.max_sge == abi::kMaxSge);
    CHECK(d.max_cqe == abi::kMaxCqEntries - 1);
    CHECK(d.atomic_cap == IBV_ATOMIC_HCA);
    CHECK(d.phys_port_cnt == 1);
    CHECK(d.vendor_id == 0xffffff);
    CHECK(d.vendor_part_id == 0x7672);
    CHECK(d.hw_ver == abi::kVersion);
    CHECK(d.node_guid == htobe64(0x1111));
    CHECK(std::string(d.fw_ver) == "0.1.0");

    auto p = t.b.cmd(CmdOp::QueryPort, abi::CmdQueryPortReq{1});
    REQUIRE(p.status == 0);
    auto pa = p.as<abi::PortAttr>();
    CHECK(pa.lid == 2);
    CHECK(pa.state == IBV_PORT_ACTIVE);
    CHECK(pa.active_mtu == IBV_MTU_4096);
    CHECK(pa.link_layer == IBV_LINK_LAYER_INFINIBAND);
    CHECK(pa.gid[0] == 0xfe);
    CHECK(pa.gid[15] == 0x22);
    CHECK(t.b.cmd(CmdOp::QueryPort, abi::CmdQueryPortReq{2}).status == EINVAL);
    CHECK(t.b.cmd(CmdOp::QueryPort, abi::CmdQueryPortReq{0}).status == EINVAL);
}

TEST_CASE("unknown command ops are refused", "[shim][commands]") {
    TwoGuests t;
    CHECK(t.a.cmd(CmdOp(0)).status == EOPNOTSUPP);
    CHECK(t.a.cmd(CmdOp::kMax).status == EOPNOTSUPP);
    CHECK(t.a.cmd(CmdOp(0xdeadbeef)).status == EOPNOTSUPP);
}

TEST_CASE("PD and MR commands validate handles, access and ranges", "[shim][commands]") {
    TwoGuests t;
    uint32_t pd = t.a.pd();
    uint64_t buf = t.a.alloc(8192, 4096);
    const uint32_t lw = IBV_ACCESS_LOCAL_WRITE;
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{0, lw, buf, 4096, buf}).status == EINVAL);
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd + 1, lw, buf, 4096, buf}).status == EINVAL);
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, buf, 0, buf}).status == EINVAL);
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, IBV_ACCESS_REMOTE_WRITE, buf, 4096, buf}).status == EINVAL);
    // ODP: over shared memory as any MR; over memory not shared (yet) or
    // the whole address space (implicit), served on demand at the
    // addresses themselves (an iova elsewhere is refused).
    for (abi::CmdRegMrReq odp : {abi::CmdRegMrReq{pd, lw | IBV_ACCESS_ON_DEMAND, buf, 4096, buf},
                                 abi::CmdRegMrReq{pd, lw | IBV_ACCESS_ON_DEMAND, 0x1000, 4096, 0x1000},
                                 abi::CmdRegMrReq{pd, lw | IBV_ACCESS_ON_DEMAND, 0, ~0ull, 0}}) {
        auto made = t.a.cmd(CmdOp::RegMr, odp);
        REQUIRE(made.status == 0);
        CHECK(t.a.cmd(CmdOp::DeregMr, abi::CmdHandleReq{made.as<abi::CmdRegMrResp>().mr_handle}).status == 0);
    }
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw | IBV_ACCESS_ON_DEMAND, 0x1000, 4096, 0x2000}).status ==
          EFAULT);
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, 0, ~0ull, 0}).status == EINVAL);  // implicit needs ODP
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, ~0ull - 10, 100, ~0ull - 10}).status == EINVAL);  // wraps
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, 0x1000, 4096, 0x1000}).status == EFAULT);     // no segment
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, buf, 1ull << 41, buf}).status == EINVAL);  // over max
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, t.a.gva(), FakeProvider::kArenaLen + 1, t.a.gva()}).status ==
          EFAULT);
    // A PD of the other guest is not ours, even with the same handle value
    // (handles are per context).
    uint32_t pd_b = t.b.pd();
    t.b.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd_b});

    auto r = t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw | IBV_ACCESS_REMOTE_READ, buf + 10, 5000, buf + 10});
    REQUIRE(r.status == 0);
    auto mr = r.as<abi::CmdRegMrResp>();
    CHECK(mr.lkey != 0);
    // A PD with an MR cannot go; the MR handle is not a PD handle.
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd}).status == EBUSY);
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{mr.mr_handle}).status == ENOENT);
    CHECK(t.a.cmd(CmdOp::DeregMr, abi::CmdHandleReq{pd}).status == ENOENT);
    CHECK(t.a.cmd(CmdOp::DeregMr, abi::CmdHandleReq{mr.mr_handle}).status == 0);
    CHECK(t.a.cmd(CmdOp::DeregMr, abi::CmdHandleReq{mr.mr_handle}).status == ENOENT);  // freed
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd}).status == 0);
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd}).status == ENOENT);
    // A freed PD handle stays dead after its slot is reused.
    uint32_t pd2 = t.a.pd();
    CHECK(pd2 != pd);
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, buf, 4096, buf}).status == EINVAL);
}

TEST_CASE("an MR named by another address: the iova is what work requests use, zero-based only from 0",
          "[shim][commands]") {
    TwoGuests t;
    uint32_t pd = t.a.pd();
    uint64_t buf = t.a.alloc(8192, 4096);
    const uint32_t lw = IBV_ACCESS_LOCAL_WRITE, zb = IBV_ACCESS_ZERO_BASED;
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw | zb, buf, 4096, 4096}).status == EINVAL);  // zero-based, not at 0
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, buf, 4096, ~0ull - 100}).status == EINVAL);  // iova wraps
    CHECK(t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw, buf, 0, 0}).status == EINVAL);  // empty, not zero-based
    // An empty zero-based MR (device memory, ibv_reg_dm_mr with length 0).
    auto empty = t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw | zb, buf, 0, 0});
    REQUIRE(empty.status == 0);
    CHECK(t.a.cmd(CmdOp::DeregMr, abi::CmdHandleReq{empty.as<abi::CmdRegMrResp>().mr_handle}).status == 0);
    // Zero-based over [buf+100, +4000): the MR is [0, 4000) to work
    // requests, and the flag is not one of its rights.
    auto r = t.a.cmd(CmdOp::RegMr, abi::CmdRegMrReq{pd, lw | zb, buf + 100, 4000, 0});
    REQUIRE(r.status == 0);
    const Mr* mr = t.a.ctx().mrs.get(r.as<abi::CmdRegMrResp>().mr_handle);
    REQUIRE(mr != nullptr);
    CHECK(mr->addr == 0);
    CHECK(mr->length == 4000);
    CHECK(mr->access == lw);
    Qp qp;
    qp.pd = pd;
    t.a.at(buf + 100)[0] = 0x5a;  // the MR's byte 0, written where the guest sees it
    t.a.at(buf + 100)[3999] = 0xa5;
    const uint8_t* host = resolve_rkey(t.a.ctx(), qp, qp.pd, mr->key, 0, 4000, 0, nullptr);
    REQUIRE(host != nullptr);
    CHECK(host[0] == 0x5a);
    CHECK(host[3999] == 0xa5);
    CHECK(resolve_rkey(t.a.ctx(), qp, qp.pd, mr->key, buf + 100, 8, 0, nullptr) == nullptr);  // its own address is not the MR's
}

TEST_CASE("CQ creation validates entries and ring placement", "[shim][commands]") {
    TwoGuests t;
    uint64_t ring = t.a.alloc(abi::cq_ring_bytes(1024));
    auto create = [&](uint64_t gva, uint32_t entries, uint32_t comp_vector = 0) {
        abi::CmdCreateCqReq r{};
        r.ring_gva = gva;
        r.entries = entries;
        r.comp_vector = comp_vector;
        return t.a.cmd(CmdOp::CreateCq, r).status;
    };
    CHECK(create(ring, 0) == EINVAL);
    CHECK(create(ring, 16, abi::kCompVectors) == EINVAL);
    CHECK(create(ring, 12) == EINVAL);
    CHECK(create(ring, abi::kMaxCqEntries * 2) == EINVAL);
    CHECK(create(ring + 8, 16) == EINVAL);                         // unaligned
    CHECK(create(0, 16) == EINVAL);
    CHECK(create(0x10000, 16) == EFAULT);                          // outside every segment
    CHECK(create(t.a.gva() + FakeProvider::kArenaLen - 64, 16) == EFAULT);  // runs off the arena
    CHECK(create(t.a.gva() + FakeProvider::kArenaLen - abi::cq_ring_bytes(16), 16) == 0);
    CHECK(create(ring, 1u << 20) == EFAULT);                       // 64 MiB do not fit
    CHECK(create(ring, 1024) == 0);
    auto cq = t.a.cq(16);
    CHECK(t.a.cmd(CmdOp::DestroyCq, abi::CmdHandleReq{cq.handle}).status == 0);
    CHECK(t.a.cmd(CmdOp::DestroyCq, abi::CmdHandleReq{cq.handle}).status == ENOENT);
}

TEST_CASE("CQ resize validates the CQ, the size and the new ring", "[shim][commands]") {
    TwoGuests t;
    auto cq = t.a.cq(16);
    uint64_t ring = t.a.alloc(abi::cq_ring_bytes(64));
    auto resize = [&](uint32_t handle, uint64_t gva, uint32_t entries, uint32_t cqe) {
        abi::CmdResizeCqReq r{};
        r.cq_handle = handle;
        r.ring_gva = gva;
        r.entries = entries;
        r.cqe = cqe;
        return t.a.cmd(CmdOp::ResizeCq, r).status;
    };
    CHECK(resize(0, ring, 64, 63) == EINVAL);
    CHECK(resize(cq.handle + 1, ring, 64, 63) == EINVAL);
    CHECK(resize(cq.handle, ring, 48, 47) == EINVAL);             // not a power of two
    CHECK(resize(cq.handle, ring, 64, 64) == EINVAL);             // cqe over entries - 1
    CHECK(resize(cq.handle, ring, 64, 0) == EINVAL);
    CHECK(resize(cq.handle, ring, abi::kMaxCqEntries * 2, 1) == EINVAL);
    CHECK(resize(cq.handle, cq.ring, 16, 15) == EINVAL);          // overlaps the current ring
    CHECK(resize(cq.handle, cq.ring + 64, 64, 63) == EINVAL);
    CHECK(resize(cq.handle, 0x10000, 64, 63) == EFAULT);          // outside every segment
    CHECK(resize(cq.handle, ring, 64, 63) == 0);
    // The other guest cannot name it.
    abi::CmdResizeCqReq r{};
    r.cq_handle = cq.handle;
    r.ring_gva = t.b.alloc(abi::cq_ring_bytes(16));
    r.entries = 16;
    r.cqe = 15;
    CHECK(t.b.cmd(CmdOp::ResizeCq, r).status == EINVAL);
}

TEST_CASE("MR re-registration validates flags, PD, access and range, and changes nothing on refusal",
          "[shim][commands]") {
    TwoGuests t;
    uint32_t pd = t.a.pd(), pd2 = t.a.pd();
    const uint32_t lw = IBV_ACCESS_LOCAL_WRITE;
    auto mr = t.a.mr(pd, 4096, lw);
    uint64_t other = t.a.alloc(8192, 4096);
    auto rereg = [&](uint32_t h, uint32_t flags, uint32_t p, uint32_t access, uint64_t addr, uint64_t len) {
        return t.a.cmd(CmdOp::ReregMr, abi::CmdReregMrReq{h, flags, p, access, addr, len}).status;
    };
    CHECK(rereg(0, IBV_REREG_MR_CHANGE_ACCESS, 0, lw, 0, 0) == EINVAL);
    CHECK(rereg(mr.handle, 0, 0, 0, 0, 0) == EINVAL);
    CHECK(rereg(mr.handle, 8, 0, 0, 0, 0) == EINVAL);
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_PD, pd2 + 7, 0, 0, 0) == EINVAL);
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_ACCESS, 0, IBV_ACCESS_REMOTE_WRITE, 0, 0) == EINVAL);
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_ACCESS, 0, IBV_ACCESS_ON_DEMAND, 0, 0) == EOPNOTSUPP);
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_ACCESS, 0, lw | IBV_ACCESS_ZERO_BASED, 0, 0) == EINVAL);
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_TRANSLATION, 0, 0, other, 0) == EINVAL);
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_TRANSLATION, 0, 0, ~0ull - 10, 100) == EINVAL);
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_TRANSLATION, 0, 0, 0x1000, 4096) == EFAULT);
    // A refused PD change with a good translation changes neither.
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD, 0, 0, other, 8192) == EINVAL);
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd2}).status == 0);
    pd2 = t.a.pd();
    // PD change: the MR now holds the new PD, not the old one.
    CHECK(rereg(mr.handle, IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_TRANSLATION, pd2, 0, other, 8192) == 0);
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd2}).status == EBUSY);
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd}).status == 0);
    CHECK(t.a.ctx().mrs.get(mr.handle)->length == 8192);
    CHECK(t.a.ctx().mrs.get(mr.handle)->addr == other);
    // Another guest cannot touch it.
    CHECK(t.b.cmd(CmdOp::ReregMr, abi::CmdReregMrReq{mr.handle, IBV_REREG_MR_CHANGE_ACCESS, 0, lw, 0, 0}).status ==
          EINVAL);
}

TEST_CASE("QP creation validates every field", "[shim][commands]") {
    TwoGuests t;
    uint32_t pd = t.a.pd();
    auto cq = t.a.cq(64);
    auto cq_b = t.b.cq(64);
    FakeProvider::QpView v;
    auto base = t.a.qp_req(pd, cq, cq, {}, v);
    auto try_create = [&](auto mutate) {
        auto r = base;
        mutate(r);
        return t.a.cmd(CmdOp::CreateQp, r).status;
    };
    CHECK(try_create([](auto& r) { r.qp_type = IBV_QPT_XRC_SEND; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.qp_type = IBV_QPT_RAW_PACKET; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.qp_type = 77; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.pd_handle = 0; }) == EINVAL);
    CHECK(try_create([&](auto& r) { r.pd_handle = cq.handle; }) == EINVAL);  // wrong type
    CHECK(try_create([&](auto& r) { r.send_cq_handle = pd; }) == EINVAL);
    CHECK(try_create([&](auto& r) { r.recv_cq_handle = cq.handle ^ 0x00200000; }) == EINVAL);  // other generation
    CHECK(try_create([&](auto& r) { r.srq_handle = 5; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_entries = 0; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_entries = 24; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_entries = 32768; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_stride = 32; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_stride = 1000; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_stride = 32768; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.max_send_sge = 33; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.max_inline_data = 2048; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.max_inline_data = 1000; }) == EINVAL);  // 96+1000 > stride 1024
    CHECK(try_create([](auto& r) { r.rq_stride = 64; r.max_recv_sge = 8; }) == EINVAL);  // 16+128 > 64
    CHECK(try_create([](auto& r) { r.rq_entries = 3; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_gva += 8; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_gva = 0x20000; }) == EFAULT);
    CHECK(try_create([](auto& r) { r.rq_gva = 0; }) == EINVAL);
    CHECK(try_create([](auto& r) { r.sq_sig_all = 2; }) == EINVAL);
    // Ring that does not fit: 16 entries of 1024 bytes declared as 16384-byte strides.
    CHECK(try_create([&](auto& r) { r.sq_gva = t.a.gva() + FakeProvider::kArenaLen - 4096; }) == EFAULT);
    // Handles of another context are meaningless here.
    CHECK(try_create([&](auto& r) { r.send_cq_handle = cq_b.handle + 1; }) == EINVAL);
    CHECK(try_create([](auto&) {}) == 0);
}

TEST_CASE("modify QP: transitions, masks and values", "[shim][commands]") {
    TwoGuests t;
    uint32_t pd = t.a.pd();
    auto cq = t.a.cq(64);
    auto q = t.a.qp(pd, cq, cq);
    abi::QpAttr a{};
    const uint32_t init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    a.qp_state = IBV_QPS_RTS;
    CHECK(t.a.modify(q.handle, IBV_QP_STATE, a) == EINVAL);  // RESET -> RTS
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    CHECK(t.a.modify(q.handle, IBV_QP_STATE | IBV_QP_PORT, a) == EINVAL);  // missing attrs
    CHECK(t.a.modify(q.handle, init_mask | IBV_QP_QKEY, a) == EINVAL);     // QKEY not for RC
    CHECK(t.a.modify(q.handle, init_mask | (1u << 30), a) == EINVAL);      // unknown bit
    a.port_num = 2;
    CHECK(t.a.modify(q.handle, init_mask, a) == EINVAL);
    a.port_num = 1;
    a.pkey_index = 1;
    CHECK(t.a.modify(q.handle, init_mask, a) == EINVAL);
    a.pkey_index = 0;
    a.qp_access_flags = 1u << 9;
    CHECK(t.a.modify(q.handle, init_mask, a) == EINVAL);
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    a.qp_state = 9;
    CHECK(t.a.modify(q.handle, init_mask, a) == EINVAL);
    a.qp_state = IBV_QPS_INIT;
    CHECK(t.a.modify(0, init_mask, a) == ENOENT);
    CHECK(t.a.modify(pd, init_mask, a) == ENOENT);
    a.cur_qp_state = IBV_QPS_RTS;
    CHECK(t.a.modify(q.handle, init_mask | IBV_QP_CUR_STATE, a) == EINVAL);
    REQUIRE(t.a.modify(q.handle, init_mask, a) == 0);
    CHECK(t.a.qp_state(q.handle) == IBV_QPS_INIT);

    const uint32_t rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = q.qpn;
    a.ah.dlid = 1;
    a.ah.port_num = 1;
    auto bad = [&](auto mutate) {
        abi::QpAttr b = a;
        mutate(b);
        return t.a.modify(q.handle, rtr, b);
    };
    CHECK(bad([](auto& b) { b.path_mtu = 6; }) == EINVAL);
    CHECK(bad([](auto& b) { b.path_mtu = 0; }) == EINVAL);
    CHECK(bad([](auto& b) { b.ah.dlid = 0; }) == EINVAL);
    CHECK(bad([](auto& b) { b.ah.sl = 16; }) == EINVAL);
    CHECK(bad([](auto& b) { b.ah.is_global = 1; b.ah.sgid_index = 3; }) == EINVAL);
    CHECK(bad([](auto& b) { b.dest_qp_num = 1u << 24; }) == EINVAL);
    CHECK(bad([](auto& b) { b.rq_psn = 1u << 24; }) == EINVAL);
    CHECK(bad([](auto& b) { b.max_dest_rd_atomic = 200; }) == EINVAL);
    CHECK(bad([](auto& b) { b.min_rnr_timer = 32; }) == EINVAL);
    CHECK(t.a.modify(q.handle, rtr & ~IBV_QP_PATH_MTU, a) == EINVAL);
    REQUIRE(t.a.modify(q.handle, rtr, a) == 0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    const uint32_t rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC;
    a.retry_cnt = 8;
    CHECK(t.a.modify(q.handle, rts, a) == EINVAL);
    a.retry_cnt = 7;
    a.timeout = 32;
    CHECK(t.a.modify(q.handle, rts, a) == EINVAL);
    a.timeout = 14;
    a.rnr_retry = 8;
    CHECK(t.a.modify(q.handle, rts, a) == EINVAL);
    a.rnr_retry = 7;
    REQUIRE(t.a.modify(q.handle, rts, a) == 0);
    auto qa = t.a.cmd(CmdOp::QueryQp, abi::CmdHandleReq{q.handle}).as<abi::CmdQueryQpResp>().attr;
    CHECK(qa.qp_state == IBV_QPS_RTS);
    CHECK(qa.dest_qp_num == q.qpn);
    CHECK(qa.timeout == 14);
    CHECK(qa.max_send_wr == 16);
    CHECK(qa.max_send_sge == 4);
    CHECK(qa.max_inline_data == 256);
    a = {};
    a.qp_state = IBV_QPS_RESET;
    CHECK(t.a.modify(q.handle, IBV_QP_STATE | IBV_QP_TIMEOUT, a) == EINVAL);
    CHECK(t.a.modify(q.handle, IBV_QP_STATE, a) == 0);
    CHECK(t.a.qp_state(q.handle) == IBV_QPS_RESET);
    // Destroy: the CQ is busy while the QP exists.
    CHECK(t.a.cmd(CmdOp::DestroyCq, abi::CmdHandleReq{cq.handle}).status == EBUSY);
    CHECK(t.a.cmd(CmdOp::DestroyQp, abi::CmdHandleReq{q.handle}).status == 0);
    CHECK(t.a.cmd(CmdOp::DestroyQp, abi::CmdHandleReq{q.handle}).status == ENOENT);
    CHECK(t.a.cmd(CmdOp::QueryQp, abi::CmdHandleReq{q.handle}).status == ENOENT);
    CHECK(t.a.cmd(CmdOp::DestroyCq, abi::CmdHandleReq{cq.handle}).status == 0);
}

TEST_CASE("SRQ and AH commands validate their fields", "[shim][commands]") {
    TwoGuests t;
    uint32_t pd = t.a.pd();
    uint64_t ring = t.a.alloc(abi::wq_ring_bytes(64, 256));
    auto srq = [&](uint32_t pdh, uint32_t entries, uint32_t stride, uint32_t max_sge, uint64_t gva) {
        abi::CmdCreateSrqReq r{};
        r.ring_gva = gva;
        r.pd_handle = pdh;
        r.entries = entries;
        r.stride = stride;
        r.max_sge = max_sge;
        return t.a.cmd(CmdOp::CreateSrq, r);
    };
    CHECK(srq(0, 64, 256, 4, ring).status == EINVAL);
    CHECK(srq(pd, 63, 256, 4, ring).status == EINVAL);
    CHECK(srq(pd, 32768, 256, 4, ring).status == EINVAL);
    CHECK(srq(pd, 64, 256, 0, ring).status == EINVAL);
    CHECK(srq(pd, 64, 256, 33, ring).status == EINVAL);
    CHECK(srq(pd, 64, 64, 4, ring).status == EINVAL);  // 16 + 64 > 64
    CHECK(srq(pd, 64, 256, 4, ring + 32).status == EINVAL);
    CHECK(srq(pd, 64, 256, 4, 0x3000).status == EFAULT);
    auto r = srq(pd, 64, 256, 4, ring);
    REQUIRE(r.status == 0);
    uint32_t s = r.as<abi::CmdCreateSrqResp>().srq_handle;
    CHECK(t.a.cmd(CmdOp::ModifySrq, abi::CmdModifySrqReq{s, IBV_SRQ_LIMIT, 0, 65}).status == EINVAL);
    CHECK(t.a.cmd(CmdOp::ModifySrq, abi::CmdModifySrqReq{s, IBV_SRQ_MAX_WR, 128, 0}).status == EINVAL);
    CHECK(t.a.cmd(CmdOp::ModifySrq, abi::CmdModifySrqReq{s, 8, 0, 0}).status == EINVAL);
    CHECK(t.a.cmd(CmdOp::ModifySrq, abi::CmdModifySrqReq{pd, IBV_SRQ_LIMIT, 0, 4}).status == ENOENT);
    CHECK(t.a.cmd(CmdOp::ModifySrq, abi::CmdModifySrqReq{s, IBV_SRQ_LIMIT, 0, 4}).status == 0);
    auto q = t.a.cmd(CmdOp::QuerySrq, abi::CmdHandleReq{s}).as<abi::CmdQuerySrqResp>();
    CHECK(q.max_wr == 64);
    CHECK(q.max_sge == 4);
    CHECK(q.srq_limit == 4);

    abi::CmdCreateAhReq ah{};
    ah.pd_handle = pd;
    ah.attr.dlid = 2;
    ah.attr.port_num = 1;
    auto bad = [&](auto mutate) {
        auto x = ah;
        mutate(x);
        return t.a.cmd(CmdOp::CreateAh, x).status;
    };
    CHECK(bad([](auto& x) { x.pd_handle = 0; }) == EINVAL);
    CHECK(bad([&](auto& x) { x.pd_handle = s; }) == EINVAL);
    CHECK(bad([](auto& x) { x.attr.dlid = 0; }) == EINVAL);
    CHECK(bad([](auto& x) { x.attr.dlid = 0xffff; }) == EINVAL);  // permissive; a multicast LID is fine
    CHECK(bad([](auto& x) { x.attr.port_num = 2; }) == EINVAL);
    CHECK(bad([](auto& x) { x.attr.sl = 16; }) == EINVAL);
    CHECK(bad([](auto& x) { x.attr.is_global = 1; x.attr.sgid_index = 1; }) == EINVAL);
    auto ar = t.a.cmd(CmdOp::CreateAh, ah);
    REQUIRE(ar.status == 0);
    uint32_t h = ar.as<abi::CmdCreateAhResp>().ah_handle;
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd}).status == EBUSY);
    CHECK(t.a.cmd(CmdOp::DestroyAh, abi::CmdHandleReq{s}).status == ENOENT);
    CHECK(t.a.cmd(CmdOp::DestroyAh, abi::CmdHandleReq{h}).status == 0);
    CHECK(t.a.cmd(CmdOp::DestroyAh, abi::CmdHandleReq{h}).status == ENOENT);
    CHECK(t.a.cmd(CmdOp::DestroySrq, abi::CmdHandleReq{s}).status == 0);
    CHECK(t.a.cmd(CmdOp::DeallocPd, abi::CmdHandleReq{pd}).status == 0);
}

TEST_CASE("tag-matching SRQs and TmOp validate their fields", "[shim][commands]") {
    TwoGuests t;
    uint32_t pd = t.a.pd();
    auto cq = t.a.cq(16);
    uint64_t ring = t.a.alloc(abi::wq_ring_bytes(64, 256));
    auto srq = [&](uint32_t type, uint32_t cq_handle, uint32_t tags, uint64_t gva = 0) {
        abi::CmdCreateSrqReq r{};
        r.ring_gva = gva ? gva : ring;
        r.pd_handle = pd;
        r.entries = 64;
        r.stride = 256;
        r.max_sge = 1;
        r.srq_type = type;
        r.cq_handle = cq_handle;
        r.max_num_tags = tags;
        return t.a.cmd(CmdOp::CreateSrq, r);
    };
    CHECK(srq(IBV_SRQT_TM, 0, 4).status == EINVAL);  // no CQ
    CHECK(srq(IBV_SRQT_TM, cq.handle, 0).status == EINVAL);
    CHECK(srq(IBV_SRQT_TM, cq.handle, 1025).status == EINVAL);
    CHECK(srq(IBV_SRQT_BASIC, 0, 4).status == EINVAL);  // a tag list on a basic SRQ
    auto r = srq(IBV_SRQT_TM, cq.handle, 2);
    REQUIRE(r.status == 0);
    const uint32_t s = r.as<abi::CmdCreateSrqResp>().srq_handle;
    CHECK(t.a.cmd(CmdOp::DestroyCq, abi::CmdHandleReq{cq.handle}).status == EBUSY);  // the SRQ's CQ

    auto mr = t.a.mr(pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    auto op = [&](auto mutate) {
        abi::CmdTmOpReq o{};
        o.srq_handle = s;
        o.opcode = IBV_WR_TAG_ADD;
        o.num_sge = 1;
        o.sge[0] = abi::Sge{mr.addr, 64, mr.lkey};
        mutate(o);
        return t.a.cmd(CmdOp::TmOp, o);
    };
    CHECK(op([](auto& o) { o.srq_handle = 0; }).status == EINVAL);
    CHECK(op([](auto& o) { o.opcode = 99; }).status == EINVAL);
    CHECK(op([](auto& o) { o.flags = 4; }).status == EINVAL);
    CHECK(op([](auto& o) { o.num_sge = abi::kMaxTmSge + 1; }).status == EINVAL);
    CHECK(op([](auto& o) { o.sge[0].lkey += 1; }).status == EINVAL);
    CHECK(op([](auto& o) { o.sge[0].length = 8192; }).status == EINVAL);  // beyond the MR
    auto first = op([](auto&) {});
    REQUIRE(first.status == 0);
    CHECK(first.as<abi::CmdTmOpResp>().handle == 1);
    REQUIRE(op([](auto&) {}).status == 0);
    CHECK(op([](auto&) {}).status == ENOMEM);  // max_num_tags posted
    CHECK(op([](auto& o) { o.opcode = IBV_WR_TAG_DEL; o.handle = 0; }).status == EINVAL);
    CHECK(op([](auto& o) { o.opcode = IBV_WR_TAG_DEL; o.handle = 3; }).status == EINVAL);
    CHECK(op([](auto& o) { o.opcode = IBV_WR_TAG_DEL; o.handle = 1; }).status == 0);
    CHECK(t.a.poll(cq).empty());  // unsignaled
    // Deleting a free entry fails in its completion, signaled or not.
    CHECK(op([](auto& o) { o.opcode = IBV_WR_TAG_DEL; o.handle = 1; o.wr_id = 5; }).status == 0);
    auto c = t.a.poll(cq);
    REQUIRE(c.size() == 1);
    CHECK(c[0].wr_id == 5);
    CHECK(c[0].status == IBV_WC_TM_ERR);
    CHECK(c[0].opcode == IBV_WC_TM_DEL);

    // A basic SRQ has no list.
    auto b = srq(IBV_SRQT_BASIC, 0, 0, t.a.alloc(abi::wq_ring_bytes(64, 256)));
    REQUIRE(b.status == 0);
    const uint32_t basic = b.as<abi::CmdCreateSrqResp>().srq_handle;
    CHECK(op([&](auto& o) { o.srq_handle = basic; o.opcode = IBV_WR_TAG_SYNC; }).status == EINVAL);
    CHECK(t.a.cmd(CmdOp::DestroySrq, abi::CmdHandleReq{basic}).status == 0);
    CHECK(t.a.cmd(CmdOp::DestroySrq, abi::CmdHandleReq{s}).status == 0);
    CHECK(t.a.cmd(CmdOp::DestroyCq, abi::CmdHandleReq{cq.handle}).status == 0);
}

TEST_CASE("quotas give ENOMEM", "[shim][commands]") {
    Quotas q;
    q.max_pd = 2;
    Engine eng(q);
    auto& g = eng.add_guest("q", 1, 1);
    FakeProvider p(eng, g);
    CHECK(p.cmd(CmdOp::AllocPd).status == 0);
    CHECK(p.cmd(CmdOp::AllocPd).status == 0);
    CHECK(p.cmd(CmdOp::AllocPd).status == ENOMEM);
}

TEST_CASE("a bad cmd_producer detaches the context", "[shim][commands]") {
    TwoGuests t;
    t.a.cb()->cmd_producer.store(abi::kCmdSlots + 3);  // 19 ahead of 0
    t.a.doorbell();
    t.run(1);
    auto dead = t.eng.dead_contexts();
    REQUIRE(dead.size() == 1);
    CHECK(dead[0] == t.a.ctx_id());
    t.eng.detach(t.a.ctx_id());
    CHECK(t.a.cb()->shim_state.load() == abi::kShimFatal);
    CHECK(t.eng.context_count() == 1);
    // The other guest keeps working.
    CHECK(t.b.cmd(CmdOp::AllocPd).status == 0);
}
