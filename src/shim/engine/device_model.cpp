#include "device_model.h"

#include <endian.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "multicast_groups.h"
#include "tag_matching.h"

namespace vrdma::shim {
namespace {

uint64_t fnv1a(uint64_t h, const void* data, size_t len) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < len; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

}  // namespace

uint64_t host_id() {
    std::string text;
    std::ifstream f("/etc/machine-id");
    if (f) std::getline(f, text);
    if (text.empty()) {
        char host[256] = {};
        ::gethostname(host, sizeof(host) - 1);
        text = host;
    }
    return fnv1a(kFnvBasis, text.data(), text.size());
}

uint64_t derive_guid(uint64_t host, const std::string& guest_name) {
    uint64_t h = fnv1a(kFnvBasis, &host, sizeof(host));
    h = fnv1a(h, "/", 1);
    h = fnv1a(h, guest_name.data(), guest_name.size());
    return h ? h : 1;
}

void make_gid(uint64_t guid, uint8_t gid[16]) {
    std::memset(gid, 0, 16);
    gid[0] = 0xfe;
    gid[1] = 0x80;
    uint64_t be = htobe64(guid);
    std::memcpy(gid + 8, &be, 8);
}

std::string format_guid(uint64_t guid) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%04x:%04x:%04x:%04x", unsigned(guid >> 48) & 0xffff,
                  unsigned(guid >> 32) & 0xffff, unsigned(guid >> 16) & 0xffff, unsigned(guid) & 0xffff);
    return buf;
}

std::string format_gid(const uint8_t gid[16]) {
    std::string s;
    char buf[8];
    for (int i = 0; i < 16; i += 2) {
        std::snprintf(buf, sizeof(buf), "%02x%02x", gid[i], gid[i + 1]);
        if (i) s += ':';
        s += buf;
    }
    return s;
}

abi::DeviceAttr make_device_attr(const GuestIdentity& id, const Quotas& q) {
    abi::DeviceAttr a{};
    a.node_guid = htobe64(id.guid);
    a.sys_image_guid = htobe64(id.guid);
    a.max_mr_size = q.max_mr_size < q.max_mr_bytes ? q.max_mr_size : q.max_mr_bytes;
    a.page_size_cap = abi::kPageSize;
    a.vendor_id = kVendorId;
    a.vendor_part_id = kVendorPartId;
    a.hw_ver = kHwVersion;
    a.max_qp = q.max_qp;
    a.max_qp_wr = q.max_qp_wr;
    a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SHUTDOWN_PORT | IBV_DEVICE_PORT_ACTIVE_EVENT |
                         IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_N_NOTIFY_CQ | IBV_DEVICE_MEM_WINDOW |
                         IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC;
    a.max_sge = q.max_sge;
    a.max_sge_rd = q.max_sge;
    a.max_cq = q.max_cq;
    a.max_cqe = q.max_cqe;
    a.max_mr = q.max_mr;
    a.max_mw = q.max_mw;
    a.max_pd = q.max_pd;
    a.max_qp_rd_atom = q.max_rd_atomic;
    a.max_qp_init_rd_atom = q.max_rd_atomic;
    a.max_res_rd_atom = q.max_rd_atomic * q.max_qp;
    a.atomic_cap = IBV_ATOMIC_HCA;
    a.max_ah = q.max_ah;
    a.max_srq = q.max_srq;
    a.max_srq_wr = q.max_srq_wr;
    a.max_srq_sge = q.max_sge;
    a.max_inline_data = q.max_inline;
    a.max_mcast_grp = MulticastGroups::kMaxGroups;
    a.max_tm_tags = kTmMaxTags;
    a.max_mcast_qp_attach = MulticastGroups::kMaxQpsPerGroupPerGuest;
    a.max_total_mcast_qp_attach = MulticastGroups::kMaxAttachPerGuest;
    a.max_pkeys = kMaxPkeys;
    a.local_ca_ack_delay = 16;
    a.phys_port_cnt = 1;
    std::snprintf(a.fw_ver, sizeof(a.fw_ver), "%s", kFwVersion);
    return a;
}

abi::PortAttr make_port_attr(const GuestIdentity& id) {
    abi::PortAttr p{};
    p.state = id.port_active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    p.max_mtu = IBV_MTU_4096;
    p.active_mtu = IBV_MTU_4096;
    p.gid_tbl_len = kGidTableLen;
    p.port_cap_flags = IBV_PORT_SYS_IMAGE_GUID_SUP;
    p.max_msg_sz = kMaxMsgSize;
    p.pkey_tbl_len = uint16_t(id.pkeys.size());
    p.lid = id.lid;
    p.sm_lid = 1;
    p.lmc = 0;
    p.max_vl_num = 1;  // VL0 only
    p.sm_sl = 0;
    p.subnet_timeout = 18;
    p.active_width = 2;   // 4X
    p.active_speed = 32;  // EDR
    p.phys_state = id.port_active ? 5 : 3;  // LinkUp, or Disabled
    p.link_layer = IBV_LINK_LAYER_INFINIBAND;
    make_gid(id.guid, p.gid);
    return p;
}

}  // namespace vrdma::shim
