// ibv_query_device(_ex) and ibv_query_port.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "context.h"
#include "verbs.h"

namespace vrdma::prov {

int query_device_ex(ibv_context* ibctx, const ibv_query_device_ex_input*, ibv_device_attr_ex* attr,
                    size_t attr_size) {
    Context& ctx = ctx_of(ibctx);
    if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
    abi::DeviceAttr d{};
    if (int rc = command(ctx, abi::CmdOp::QueryDevice, nullptr, 0, &d, sizeof(d))) return rc;

    ibv_device_attr_ex ex{};
    ibv_device_attr& a = ex.orig_attr;
    d.fw_ver[sizeof(d.fw_ver) - 1] = 0;
    std::snprintf(a.fw_ver, sizeof(a.fw_ver), "%s", d.fw_ver);
    a.node_guid = d.node_guid;
    a.sys_image_guid = d.sys_image_guid;
    a.max_mr_size = d.max_mr_size;
    a.page_size_cap = d.page_size_cap;
    a.vendor_id = d.vendor_id;
    a.vendor_part_id = d.vendor_part_id;
    a.hw_ver = d.hw_ver;
    a.max_qp = int(d.max_qp);
    a.max_qp_wr = int(d.max_qp_wr);
    a.device_cap_flags = d.device_cap_flags;
    a.max_sge = int(d.max_sge);
    a.max_sge_rd = int(d.max_sge_rd);
    a.max_cq = int(d.max_cq);
    a.max_cqe = int(d.max_cqe);
    a.max_mr = int(d.max_mr);
    a.max_mw = int(d.max_mw);
    a.max_pd = int(d.max_pd);
    a.max_qp_rd_atom = int(d.max_qp_rd_atom);
    a.max_qp_init_rd_atom = int(d.max_qp_init_rd_atom);
    a.max_res_rd_atom = int(d.max_res_rd_atom);
    a.atomic_cap = static_cast<ibv_atomic_cap>(d.atomic_cap);
    a.max_ah = int(d.max_ah);
    a.max_mcast_grp = int(d.max_mcast_grp);
    a.max_mcast_qp_attach = int(d.max_mcast_qp_attach);
    a.max_total_mcast_qp_attach = int(d.max_total_mcast_qp_attach);
    a.max_srq = int(d.max_srq);
    a.max_srq_wr = int(d.max_srq_wr);
    a.max_srq_sge = int(d.max_srq_sge);
    a.max_pkeys = uint16_t(d.max_pkeys);
    a.local_ca_ack_delay = uint8_t(d.local_ca_ack_delay);
    a.phys_port_cnt = uint8_t(d.phys_port_cnt);
    ex.phys_port_cnt_ex = d.phys_port_cnt;
    ex.max_dm_size = kMaxDmBytes;
    // Completion timestamps (kCqExWcFlags) and ibv_query_rt_values_ex.
    ex.completion_timestamp_mask = ~uint64_t(0);
    // Tag matching, in the shim (docs/protocol.md "Tag matching").
    if (d.max_tm_tags) {
        ex.tm_caps.max_rndv_hdr_size = abi::kMaxRndvHeaderBytes;
        ex.tm_caps.max_num_tags = d.max_tm_tags;
        ex.tm_caps.flags = IBV_TM_CAP_RC;
        ex.tm_caps.max_ops = abi::kMaxTmOps;
        ex.tm_caps.max_sge = abi::kMaxTmSge;
    }
    ex.hca_core_clock = kCoreClockKhz;
    // On-demand paging (on_demand.h): every operation of RC, UC and UD, the
    // implicit MR too; XRC sends and XRC SRQ receives.
    ex.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
    constexpr uint32_t kRecv = IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
    ex.odp_caps.per_transport_caps.rc_odp_caps = IBV_ODP_SUPPORT_SEND | kRecv | IBV_ODP_SUPPORT_WRITE |
                                                 IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC;
    ex.odp_caps.per_transport_caps.uc_odp_caps = IBV_ODP_SUPPORT_SEND | kRecv | IBV_ODP_SUPPORT_WRITE;
    ex.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | kRecv;
    ex.xrc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_SRQ_RECV;

    std::memcpy(attr, &ex, std::min(attr_size, sizeof(ex)));
    return 0;
}

// The device clock is the host's CLOCK_MONOTONIC, which the application
// reads as the shim does: no command. As on mlx5, the raw clock is a count
// of ticks in tv_nsec (tv_sec 0).
int query_rt_values(ibv_context*, ibv_values_ex* values) {
    if (values->comp_mask & ~uint32_t(IBV_VALUES_MASK_RAW_CLOCK)) return EINVAL;
    uint32_t filled = 0;
    if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
        timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        values->raw_clock.tv_sec = 0;
        values->raw_clock.tv_nsec = long(uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec));
        filled |= IBV_VALUES_MASK_RAW_CLOCK;
    }
    values->comp_mask = filled;  // what was filled in
    return 0;
}

int query_port(ibv_context* ibctx, uint8_t port_num, ibv_port_attr* pa) {
    Context& ctx = ctx_of(ibctx);
    abi::CmdQueryPortReq req{port_num};
    abi::PortAttr p{};
    if (int rc = command(ctx, abi::CmdOp::QueryPort, &req, sizeof(req), &p, sizeof(p))) return rc;
    pa->state = static_cast<ibv_port_state>(p.state);
    pa->max_mtu = static_cast<ibv_mtu>(p.max_mtu);
    pa->active_mtu = static_cast<ibv_mtu>(p.active_mtu);
    pa->gid_tbl_len = int(p.gid_tbl_len);
    pa->port_cap_flags = p.port_cap_flags;
    pa->max_msg_sz = p.max_msg_sz;
    pa->bad_pkey_cntr = 0;
    pa->qkey_viol_cntr = 0;
    pa->pkey_tbl_len = uint16_t(p.pkey_tbl_len);
    pa->lid = p.lid;
    pa->sm_lid = p.sm_lid;
    pa->lmc = p.lmc;
    pa->max_vl_num = p.max_vl_num;
    pa->sm_sl = p.sm_sl;
    pa->subnet_timeout = p.subnet_timeout;
    pa->init_type_reply = 0;
    pa->active_width = p.active_width;
    pa->active_speed = p.active_speed;
    pa->phys_state = p.phys_state;
    pa->link_layer = p.link_layer;
    pa->flags = 0;
    pa->port_cap_flags2 = 0;
    return 0;
}

}  // namespace vrdma::prov
