// The device's identity and the errno of each bad argument, as a generic
// verbs test program checks them (man pages; rxe and the kernel's uverbs).
#include <endian.h>
#include <fcntl.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "verbs_fixture.h"

using namespace vt;

TEST_CASE("device identity: vendor, part, hardware and firmware versions", "[api][attr]") {
    Device dev;
    ibv_device_attr da{};
    REQUIRE(ibv_query_device(dev.ctx, &da) == 0);
    // No IEEE OUI of its own: the IBTA value for that, as rxe reports it;
    // the part id names vrdma within it (docs/protocol.md, "Device identity").
    CHECK(da.vendor_id == 0xffffff);
    CHECK(da.vendor_part_id == 0x7672);
    CHECK(da.hw_ver == 10);                      // device ABI version (abi::kVersion)
    CHECK(std::strcmp(da.fw_ver, "0.1.0") == 0);  // shim release
    CHECK(da.node_guid != 0);
    CHECK(da.sys_image_guid == da.node_guid);
}

TEST_CASE("the GID table: the port's GID at index 0, the other entries empty", "[api][attr]") {
    Device dev;
    ibv_port_attr pa{};
    REQUIRE(ibv_query_port(dev.ctx, 1, &pa) == 0);
    CHECK(pa.gid_tbl_len == 8);
    ibv_gid_entry e{};
    REQUIRE(ibv_query_gid_ex(dev.ctx, 1, 0, &e, 0) == 0);
    CHECK(e.gid_type == IBV_GID_TYPE_IB);
    CHECK(e.gid.global.subnet_prefix == htobe64(0xfe80000000000000ull));
    for (uint32_t i = 1; i < uint32_t(pa.gid_tbl_len); ++i) CHECK(ibv_query_gid_ex(dev.ctx, 1, i, &e, 0) == ENODATA);
    ibv_gid_entry table[8]{};
    CHECK(ibv_query_gid_table(dev.ctx, table, 8, 0) == 1);
    CHECK(table[0].gid_index == 0);
    // No AH may name an empty entry.
    ibv_ah_attr ah{};
    ah.dlid = dev.lid;
    ah.port_num = 1;
    ah.is_global = 1;
    ah.grh.sgid_index = 1;
    ah.grh.dgid = e.gid;
    errno = 0;
    CHECK(ibv_create_ah(dev.pd, &ah) == nullptr);
    CHECK(errno == EINVAL);
}

TEST_CASE("create_cq: comp_vector must be below num_comp_vectors", "[api][attr]") {
    Device dev;
    REQUIRE(dev.ctx->num_comp_vectors == 1);
    errno = 0;
    CHECK(ibv_create_cq(dev.ctx, 4, nullptr, nullptr, dev.ctx->num_comp_vectors) == nullptr);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(ibv_create_cq(dev.ctx, 4, nullptr, nullptr, -1) == nullptr);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(ibv_create_cq(dev.ctx, 0, nullptr, nullptr, 0) == nullptr);
    CHECK(errno == EINVAL);
    ibv_device_attr da{};
    REQUIRE(ibv_query_device(dev.ctx, &da) == 0);
    errno = 0;
    CHECK(ibv_create_cq(dev.ctx, da.max_cqe + 1, nullptr, nullptr, 0) == nullptr);
    CHECK(errno == EINVAL);
    Device other(Device::kPeer);
    ibv_comp_channel* foreign = ibv_create_comp_channel(other.ctx);
    REQUIRE(foreign);
    errno = 0;
    CHECK(ibv_create_cq(dev.ctx, 4, nullptr, foreign, 0) == nullptr);
    CHECK(errno == EINVAL);
    CHECK(ibv_destroy_comp_channel(foreign) == 0);
    ibv_cq* cq = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, dev.ctx->num_comp_vectors - 1);
    REQUIRE(cq);
    CHECK(cq->cqe >= 4);
    CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("create_qp_ex: what is not offered is EOPNOTSUPP; objects in use are EBUSY", "[api][attr]") {
    Device dev;
    ibv_cq* cq = ibv_create_cq(dev.ctx, 8, nullptr, nullptr, 0);
    REQUIRE(cq);
    ibv_qp_init_attr_ex ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {4, 4, 1, 1, 0};
    ia.pd = dev.pd;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    ia.create_flags = IBV_QP_CREATE_SCATTER_FCS;
    errno = 0;
    CHECK(ibv_create_qp_ex(dev.ctx, &ia) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.send_ops_flags = IBV_QP_EX_WITH_TSO;
    errno = 0;
    CHECK(ibv_create_qp_ex(dev.ctx, &ia) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    ia.send_ops_flags = IBV_QP_EX_WITH_SEND;
    ibv_qp* qp = ibv_create_qp_ex(dev.ctx, &ia);
    REQUIRE(qp);
    CHECK(ibv_destroy_cq(cq) == EBUSY);
    CHECK(ibv_dealloc_pd(dev.pd) == EBUSY);
    CHECK(ibv_destroy_qp(qp) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("create_qp and create_srq: bad capabilities and foreign objects", "[api][attr]") {
    Device dev, other(Device::kPeer);
    ibv_device_attr da{};
    REQUIRE(ibv_query_device(dev.ctx, &da) == 0);
    ibv_cq* cq = ibv_create_cq(dev.ctx, 8, nullptr, nullptr, 0);
    ibv_cq* foreign_cq = ibv_create_cq(other.ctx, 8, nullptr, nullptr, 0);
    REQUIRE(cq);
    REQUIRE(foreign_cq);
    auto attempt = [&](auto&& edit) {
        ibv_qp_init_attr ia{};
        ia.send_cq = cq;
        ia.recv_cq = cq;
        ia.qp_type = IBV_QPT_RC;
        ia.cap = {4, 4, 1, 1, 0};
        edit(ia);
        errno = 0;
        ibv_qp* qp = ibv_create_qp(dev.pd, &ia);
        int e = qp ? 0 : errno;
        if (qp) ibv_destroy_qp(qp);
        return e;
    };
    CHECK(attempt([](ibv_qp_init_attr&) {}) == 0);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.cap.max_send_wr = da.max_qp_wr + 1; }) == EINVAL);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.cap.max_recv_wr = da.max_qp_wr + 1; }) == EINVAL);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.cap.max_send_sge = da.max_sge + 1; }) == EINVAL);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.cap.max_recv_sge = da.max_sge + 1; }) == EINVAL);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.cap.max_inline_data = 1u << 20; }) == EINVAL);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.send_cq = nullptr; }) == EINVAL);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.send_cq = foreign_cq; }) == EINVAL);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.recv_cq = foreign_cq; }) == EINVAL);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.qp_type = IBV_QPT_RAW_PACKET; }) == EOPNOTSUPP);

    ibv_srq_init_attr si{};
    si.attr = {16, 1, 0};
    ibv_srq* foreign_srq = ibv_create_srq(other.pd, &si);
    REQUIRE(foreign_srq);
    CHECK(attempt([&](ibv_qp_init_attr& a) { a.srq = foreign_srq; }) == EINVAL);
    CHECK(ibv_destroy_srq(foreign_srq) == 0);

    auto srq_attempt = [&](ibv_srq_attr attr) {
        ibv_srq_init_attr s{};
        s.attr = attr;
        errno = 0;
        ibv_srq* srq = ibv_create_srq(dev.pd, &s);
        int e = srq ? 0 : errno;
        if (srq) ibv_destroy_srq(srq);
        return e;
    };
    CHECK(srq_attempt({16, 1, 0}) == 0);
    CHECK(srq_attempt({uint32_t(da.max_srq_wr) + 1, 1, 0}) == EINVAL);
    CHECK(srq_attempt({16, uint32_t(da.max_srq_sge) + 1, 0}) == EINVAL);
    CHECK(srq_attempt({16, 1, 17}) == EINVAL);  // limit above max_wr

    CHECK(ibv_destroy_cq(foreign_cq) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("reg_mr: access flags as the kernel checks them", "[api][attr]") {
    Device dev;
    Buffer scratch(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    auto attempt = [&](int access) {
        errno = 0;
        ibv_mr* mr = ibv_reg_mr(dev.pd, scratch.data, 4096, access);
        int e = mr ? 0 : errno;
        if (mr) ibv_dereg_mr(mr);
        return e;
    };
    CHECK(attempt(0) == 0);
    CHECK(attempt(IBV_ACCESS_REMOTE_READ) == 0);
    CHECK(attempt(IBV_ACCESS_REMOTE_WRITE) == EINVAL);   // remote write needs local write
    CHECK(attempt(IBV_ACCESS_REMOTE_ATOMIC) == EINVAL);  // so does remote atomic
    CHECK(attempt(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE) == 0);  // verbs_odp_test.cpp
    CHECK(attempt(IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE) == EINVAL);  // device memory only
    CHECK(attempt(IBV_ACCESS_LOCAL_WRITE | (1 << 12)) == EINVAL);  // no such flag
    CHECK(attempt(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING) == 0);  // optional: ignored
    errno = 0;
    CHECK(ibv_reg_mr(dev.pd, scratch.data, 0, IBV_ACCESS_LOCAL_WRITE) == nullptr);
    CHECK(errno == EINVAL);
}

TEST_CASE("modify_qp and create_ah: out-of-range attributes are EINVAL", "[api][attr]") {
    Device dev;
    Qp q(dev);
    ibv_device_attr da{};
    REQUIRE(ibv_query_device(dev.ctx, &da) == 0);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 2;
    a.qp_access_flags = 0;
    int init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    CHECK(ibv_modify_qp(q.qp, &a, init_mask) == EINVAL);  // no port 2
    a.port_num = 1;
    a.pkey_index = 1;
    CHECK(ibv_modify_qp(q.qp, &a, init_mask) == EINVAL);  // one P_Key
    a.pkey_index = 0;
    REQUIRE(ibv_modify_qp(q.qp, &a, init_mask) == 0);

    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTR;
    r.path_mtu = IBV_MTU_4096;
    r.dest_qp_num = q.qpn();
    r.rq_psn = 0;
    r.max_dest_rd_atomic = uint8_t(da.max_qp_rd_atom + 1);
    r.min_rnr_timer = 1;
    r.ah_attr.dlid = dev.lid;
    r.ah_attr.port_num = 1;
    int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    CHECK(ibv_modify_qp(q.qp, &r, rtr_mask) == EINVAL);
    r.max_dest_rd_atomic = 1;
    r.ah_attr.sl = 16;
    CHECK(ibv_modify_qp(q.qp, &r, rtr_mask) == EINVAL);
    r.ah_attr.sl = 0;
    r.rq_psn = 1u << 24;
    CHECK(ibv_modify_qp(q.qp, &r, rtr_mask) == EINVAL);
    r.rq_psn = 0;
    REQUIRE(ibv_modify_qp(q.qp, &r, rtr_mask) == 0);

    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = 14;
    s.retry_cnt = 8;
    s.rnr_retry = 7;
    s.sq_psn = 0;
    s.max_rd_atomic = 1;
    int rts_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                   IBV_QP_MAX_QP_RD_ATOMIC;
    CHECK(ibv_modify_qp(q.qp, &s, rts_mask) == EINVAL);
    s.retry_cnt = 7;
    s.max_rd_atomic = uint8_t(da.max_qp_init_rd_atom + 1);
    CHECK(ibv_modify_qp(q.qp, &s, rts_mask) == EINVAL);
    s.max_rd_atomic = 1;
    CHECK(ibv_modify_qp(q.qp, &s, rts_mask) == 0);

    ibv_ah_attr ah{};
    ah.port_num = 1;
    errno = 0;
    CHECK(ibv_create_ah(dev.pd, &ah) == nullptr);  // LID 0
    CHECK(errno == EINVAL);
    ah.dlid = 0xffff;  // the permissive LID (a multicast one is fine: verbs_mcast_test.cpp)
    errno = 0;
    CHECK(ibv_create_ah(dev.pd, &ah) == nullptr);
    CHECK(errno == EINVAL);
    ah.dlid = dev.lid;
    ah.port_num = 2;
    errno = 0;
    CHECK(ibv_create_ah(dev.pd, &ah) == nullptr);
    CHECK(errno == EINVAL);
    ah.port_num = 1;
    ah.is_global = 1;
    ah.grh.sgid_index = 1;  // the GID table has one entry
    errno = 0;
    CHECK(ibv_create_ah(dev.pd, &ah) == nullptr);
    CHECK(errno == EINVAL);
    ah.is_global = 0;
    ibv_ah* ok = ibv_create_ah(dev.pd, &ah);
    REQUIRE(ok);
    CHECK(ibv_destroy_ah(ok) == 0);
}

// What README.md ("Verbs not offered") says each unsupported verb returns.
TEST_CASE("verbs not offered return the errno the README documents", "[api][unsupported]") {
    Device dev;
    ibv_qp_open_attr oa{};
    errno = 0;
    CHECK(ibv_open_qp(dev.ctx, &oa) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    errno = 0;
    CHECK(ibv_alloc_td(dev.ctx, nullptr) == nullptr);
    CHECK(errno == EOPNOTSUPP);

    ibv_device_attr da{};
    REQUIRE(ibv_query_device(dev.ctx, &da) == 0);
    CHECK((da.device_cap_flags &
           (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_MEM_MGT_EXTENSIONS)) == 0);

    // Atomic write (only through ibv_wr_atomic_write: ibv_send_wr has no
    // field for its value) and the opcodes of no software device: EINVAL at
    // post.
    Qp q(dev);
    connect_rc(q.qp, dev.lid, q.qpn());
    Buffer buf(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge s = sge(buf, 0, 8);
    for (ibv_wr_opcode op : {IBV_WR_ATOMIC_WRITE, IBV_WR_TSO, IBV_WR_DRIVER1}) {
        ibv_send_wr wr{}, *bad = nullptr;
        wr.opcode = op;
        wr.sg_list = &s;
        wr.num_sge = 1;
        INFO("opcode " << int(op));
        CHECK(ibv_post_send(q.qp, &wr, &bad) == EINVAL);
        CHECK(bad == &wr);
    }
    ibv_qp_init_attr_ex ia{};
    ia.qp_type = IBV_QPT_RC;
    ia.send_cq = q.send_cq;
    ia.recv_cq = q.recv_cq;
    ia.cap = {4, 4, 1, 1, 0};
    ia.pd = dev.pd;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    for (uint64_t op : {uint64_t(IBV_QP_EX_WITH_TSO)}) {
        ia.send_ops_flags = IBV_QP_EX_WITH_SEND | op;
        errno = 0;
        INFO("send_ops_flags " << op);
        CHECK(ibv_create_qp_ex(dev.ctx, &ia) == nullptr);
        CHECK(errno == EOPNOTSUPP);
    }
    ibv_qp_init_attr xi{};
    xi.qp_type = IBV_QPT_RAW_PACKET;
    xi.send_cq = q.send_cq;
    xi.recv_cq = q.recv_cq;
    xi.cap = {4, 4, 1, 1, 0};
    errno = 0;
    CHECK(ibv_create_qp(dev.pd, &xi) == nullptr);
    CHECK(errno == EOPNOTSUPP);

    // SRQ resizing (no IBV_DEVICE_SRQ_RESIZE).
    ibv_srq_init_attr si{};
    si.attr = {16, 1, 0};
    ibv_srq* srq = ibv_create_srq(dev.pd, &si);
    REQUIRE(srq);
    ibv_srq_attr sa{};
    sa.max_wr = si.attr.max_wr * 2;
    CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) == EINVAL);
    CHECK(ibv_destroy_srq(srq) == 0);
}
