#include "hca_device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "hca_completions.h"
#include "work_queue.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {


// Work request ids: [63] receive, [62] SRQ receive, [61:32] the device
// QP's generation (an SRQ receive: the DeviceSrq's id), [31:0] the guest
// ring index (an SRQ receive: the shadow slot).
constexpr uint64_t kRecvBit = 1ull << 63;
constexpr uint64_t kSrqBit = 1ull << 62;
uint64_t make_wr_id(bool recv, uint32_t gen, uint32_t idx) {
    return (recv ? kRecvBit : 0) | (uint64_t(gen) << 32) | idx;
}

bool ipv4_mapped(const ibv_gid& g) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return std::memcmp(g.raw, prefix, sizeof(prefix)) == 0;
}
bool zero_gid(const ibv_gid& g) {
    static const uint8_t zero[16] = {};
    return std::memcmp(g.raw, zero, 16) == 0;
}

// The guest's SGEs as the device's (keys and addresses are the same).
int to_ibv_sges(const abi::Sge* in, uint32_t n, ibv_sge* out) {
    for (uint32_t i = 0; i < n; ++i) out[i] = ibv_sge{in[i].addr, in[i].length, in[i].lkey};
    return int(n);
}

int to_ud_recv_sges(const HeaderSlots& h, uint32_t slot, const abi::Sge* in, uint32_t n, ibv_sge* out) {
    return ud_receive_sges(ibv_sge{reinterpret_cast<uint64_t>(h.at(slot)), HeaderSlots::kBytes, h.mr->lkey}, in, n,
                           out);
}

int modify(ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* what) {
    int rc = ibv_modify_qp(qp, &attr, mask);
    if (rc) LOG_WARN("hca: device QP %u to %s: %s", qp->qp_num, what, strerror(rc));
    return rc;
}

}  // namespace

DevicePd::~DevicePd() {
    if (unbind_mr) ibv_dereg_mr(unbind_mr);
    if (pd) ibv_dealloc_pd(pd);
}
DeviceMr::~DeviceMr() {
    if (mr) ibv_dereg_mr(mr);
}
DeviceQp::~DeviceQp() {
    if (qp) ibv_destroy_qp(qp);
    if (owner) owner->release_cq_room(*this);
}

int ud_receive_sges(const ibv_sge& header, const abi::Sge* in, uint32_t n, ibv_sge* out) {
    int k = 0;
    out[k++] = header;
    uint64_t skip = HeaderSlots::kBytes;
    for (uint32_t i = 0; i < n; ++i) {
        const uint64_t cut = std::min<uint64_t>(skip, in[i].length);
        skip -= cut;
        if (in[i].length > cut) out[k++] = ibv_sge{in[i].addr + cut, uint32_t(in[i].length - cut), in[i].lkey};
    }
    return k;
}

HeaderSlots::~HeaderSlots() {
    if (mr) ibv_dereg_mr(mr);
}

DeviceMw::~DeviceMw() {
    if (mw) ibv_dealloc_mw(mw);
}

DeviceAh::~DeviceAh() {
    if (ah) ibv_destroy_ah(ah);
}

DeviceSrq::~DeviceSrq() {
    if (srq) ibv_destroy_srq(srq);
    if (owner) owner->forget_srq(id);
}


int DeviceQp::to_error() {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_ERR;
    return modify(qp, r, IBV_QP_STATE, "ERR");
}

int DeviceQp::to_reset() {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RESET;
    gen = (gen + 1) & kGenMask;  // completions still in the CQ are of the old life
    return modify(qp, r, IBV_QP_STATE, "RESET");
}

HcaDevice::~HcaDevice() {
    for (auto& c : cqs_)
        if (c.cq) ibv_destroy_cq(c.cq);
    if (channel_) ibv_destroy_comp_channel(channel_);
    if (ctx_) ibv_close_device(ctx_);
}

std::unique_ptr<HcaDevice> HcaDevice::open(const std::string& spec, std::string& error) {
    std::unique_ptr<HcaDevice> d(new HcaDevice);
    std::string dev = spec;
    if (size_t colon = spec.rfind(':'); colon != std::string::npos) {
        dev = spec.substr(0, colon);
        char* end = nullptr;
        unsigned long p = std::strtoul(spec.c_str() + colon + 1, &end, 10);
        if (colon + 1 == spec.size() || *end || p == 0 || p > 255) {
            error = "--hca " + spec + ": the port must be a number from 1 to 255";
            return nullptr;
        }
        d->port_ = uint8_t(p);
    }
    d->name_ = dev;
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) {
        error = std::string("--hca: cannot list RDMA devices: ") + strerror(errno);
        return nullptr;
    }
    std::string names;
    for (int i = 0; i < n; ++i) {
        const char* nm = ibv_get_device_name(list[i]);
        names += (names.empty() ? "" : ", ") + std::string(nm);
        if (dev == nm) d->ctx_ = ibv_open_device(list[i]);
    }
    ibv_free_device_list(list);
    if (!d->ctx_) {
        error = "--hca " + spec + ": no RDMA device named " + dev + " (devices here: " +
                (names.empty() ? std::string("none") : names) + ")";
        return nullptr;
    }
    if (ibv_query_device(d->ctx_, &d->attr_)) {
        error = "--hca " + spec + ": ibv_query_device: " + strerror(errno);
        return nullptr;
    }
    ibv_port_attr pa{};
    if (d->port_ > d->attr_.phys_port_cnt || ibv_query_port(d->ctx_, d->port_, &pa)) {
        error = "--hca " + spec + ": the device has no port " + std::to_string(d->port_);
        return nullptr;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
        error = "--hca " + spec + ": port " + std::to_string(d->port_) + " is not active (state " +
                ibv_port_state_str(pa.state) + ")";
        return nullptr;
    }
    d->active_mtu_ = pa.active_mtu;
    // The IPv4-mapped GID if there is one, else the first non-zero one.
    d->gid_index_ = -1;
    for (int i = 0; i < pa.gid_tbl_len; ++i) {
        ibv_gid g{};
        if (ibv_query_gid(d->ctx_, d->port_, i, &g) || zero_gid(g)) continue;
        if (d->gid_index_ < 0 || ipv4_mapped(g)) {
            d->gid_ = g;
            d->gid_index_ = i;
        }
        if (ipv4_mapped(g)) break;
    }
    if (d->gid_index_ < 0) {
        error = "--hca " + spec + ": port " + std::to_string(d->port_) + " has no GID";
        return nullptr;
    }
    d->channel_ = ibv_create_comp_channel(d->ctx_);
    if (!d->channel_) {
        error = "--hca " + spec + ": ibv_create_comp_channel: " + strerror(errno);
        return nullptr;
    }
    for (int fd : {d->channel_->fd, d->ctx_->async_fd}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    d->wcs_.resize(32);
    return d;
}

std::string HcaDevice::memlock_advice() {
    // CAP_IPC_LOCK (bit 14 of the effective set) lifts the limit.
    if (FILE* f = std::fopen("/proc/self/status", "r")) {
        char line[256];
        unsigned long long caps = 0;
        while (std::fgets(line, sizeof(line), f))
            if (std::sscanf(line, "CapEff: %llx", &caps) == 1) break;
        std::fclose(f);
        if (caps & (1ull << 14)) return "";
    }
    rlimit r{};
    if (getrlimit(RLIMIT_MEMLOCK, &r) || r.rlim_cur == RLIM_INFINITY) return "";
    return "RLIMIT_MEMLOCK is " + std::to_string(r.rlim_cur >> 10) +
           " KiB for the registered memory of all guests together (the device pins every MR): registrations "
           "beyond it fail with ENOMEM; raise it (ulimit -l unlimited, systemd LimitMEMLOCK=infinity) or give "
           "the shim CAP_IPC_LOCK";
}

std::string HcaDevice::describe() const {
    char gid[INET6_ADDRSTRLEN] = "";
    inet_ntop(AF_INET6, gid_.raw, gid, sizeof(gid));
    return name_ + ":" + std::to_string(port_) + " gid " + gid + " (index " + std::to_string(gid_index_) + ")";
}

std::unique_ptr<HeaderSlots> HcaDevice::make_header_slots(const std::shared_ptr<DevicePd>& pd, uint32_t count,
                                                          int& err) {
    auto h = std::make_unique<HeaderSlots>();
    h->count = std::max<uint32_t>(count, 1);
    const uint64_t bytes = uint64_t(h->count) * HeaderSlots::kBytes;
    h->bytes = std::make_unique<uint8_t[]>(bytes);
    h->mr = ibv_reg_mr(pd->pd, h->bytes.get(), bytes, int(IBV_ACCESS_LOCAL_WRITE));
    if (!h->mr) {
        err = errno ? errno : ENOMEM;
        LOG_WARN("hca %s: ibv_reg_mr (UD header slots): %s", name_.c_str(), strerror(err));
        return nullptr;
    }
    return h;
}

std::shared_ptr<DevicePd> HcaDevice::alloc_pd(int& err) {
    auto pd = std::make_shared<DevicePd>();
    pd->pd = ibv_alloc_pd(ctx_);
    if (!pd->pd) {
        err = errno ? errno : ENOMEM;
        LOG_WARN("hca %s: ibv_alloc_pd: %s", name_.c_str(), strerror(err));
        return nullptr;
    }
    return pd;
}

std::unique_ptr<DeviceMr> HcaDevice::reg_mr(const std::shared_ptr<DevicePd>& pd, void* host, uint64_t len,
                                            uint64_t iova, uint32_t access, int& err) {
    auto mr = std::make_unique<DeviceMr>();
    mr->mr = ibv_reg_mr_iova(pd->pd, host, len, iova, int(access));
    if (!mr->mr) {
        err = errno ? errno : ENOMEM;
        LOG_WARN("hca %s: ibv_reg_mr_iova(%#llx, %llu bytes): %s", name_.c_str(), (unsigned long long)iova,
                 (unsigned long long)len, strerror(err));
        return nullptr;
    }
    mr->pd = pd;
    return mr;
}

std::shared_ptr<DeviceSrq> HcaDevice::create_srq(const std::shared_ptr<DevicePd>& pd, uint32_t max_wr,
                                                 uint32_t max_sge, int& err) {
    ibv_srq_init_attr ia{};
    ia.attr.max_wr = max_wr;
    // One more for the header slot, should the SRQ feed UD QPs.
    ia.attr.max_sge = std::min<uint32_t>(max_sge + 1, uint32_t(std::max(attr_.max_srq_sge, 1)));
    auto s = std::make_shared<DeviceSrq>();
    s->srq = ibv_create_srq(pd->pd, &ia);
    if (!s->srq) {
        err = errno ? errno : ENOMEM;
        LOG_WARN("hca %s: ibv_create_srq(%u WRs, %u SGEs): %s", name_.c_str(), max_wr, max_sge, strerror(err));
        return nullptr;
    }
    s->pd = pd;
    // An id not in use (30 bits: the generation's place in a work request id).
    do next_srq_id_ = (next_srq_id_ + 1) & DeviceQp::kGenMask;
    while (next_srq_id_ == 0 || srqs_.count(next_srq_id_));
    s->id = next_srq_id_;
    s->owner = this;
    srqs_.emplace(s->id, s.get());
    s->wr_ids.resize(max_wr);
    s->max_sge = ia.attr.max_sge;
    s->sges.resize(uint64_t(max_wr) * s->max_sge);
    s->nsge.resize(max_wr);
    s->on_device.resize(max_wr);
    s->free.resize(max_wr);
    for (uint32_t i = 0; i < max_wr; ++i) s->free[i] = max_wr - 1 - i;
    return s;
}

std::unique_ptr<DeviceQp> HcaDevice::create_qp(const std::shared_ptr<DevicePd>& pd, uint32_t type,
                                               uint32_t send_wr, uint32_t recv_wr, uint32_t send_sge,
                                               uint32_t recv_sge, uint32_t max_inline,
                                               const std::shared_ptr<DeviceSrq>& srq, int& err) {
    const uint32_t need = send_wr + recv_wr;
    if (need > uint32_t(attr_.max_cqe)) {
        err = ENOMEM;
        return nullptr;
    }
    uint32_t slot = 0;
    while (slot < cqs_.size() && cqs_[slot].size - cqs_[slot].used < need) ++slot;
    if (slot == cqs_.size()) {
        SharedCq c;
        c.size = uint32_t(attr_.max_cqe);
        c.cq = ibv_create_cq(ctx_, int(c.size), nullptr, channel_, 0);
        if (!c.cq) {
            err = errno ? errno : ENOMEM;
            LOG_WARN("hca %s: ibv_create_cq(%u): %s", name_.c_str(), c.size, strerror(err));
            return nullptr;
        }
        c.size = uint32_t(c.cq->cqe);
        cqs_.push_back(c);
    }
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cqs_[slot].cq;
    ia.qp_type = ibv_qp_type(type);
    ia.cap.max_send_wr = send_wr;
    ia.cap.max_recv_wr = srq ? 0 : recv_wr;
    ia.cap.max_send_sge = std::max<uint32_t>(send_sge, 1);
    // UD: one more for the header slot.
    const uint32_t rsge = type == IBV_QPT_UD ? std::min<uint32_t>(recv_sge + 1, uint32_t(attr_.max_sge)) : recv_sge;
    ia.cap.max_recv_sge = srq ? 0 : std::max<uint32_t>(rsge, 1);
    ia.srq = srq ? srq->srq : nullptr;
    ia.cap.max_inline_data = max_inline;
    auto q = std::make_unique<DeviceQp>();
    q->qp = ibv_create_qp(pd->pd, &ia);
    if (!q->qp) {
        err = errno ? errno : ENOMEM;
        LOG_WARN("hca %s: ibv_create_qp(sq %u rq %u sge %u/%u inline %u): %s", name_.c_str(), send_wr, recv_wr,
                 send_sge, recv_sge, max_inline, strerror(err));
        return nullptr;
    }
    if (type == IBV_QPT_UD && !srq && !(q->headers = make_header_slots(pd, recv_wr, err))) return nullptr;
    q->pd = pd;
    q->srq = srq;
    q->owner = this;
    q->cq_slot = slot;
    q->cq_entries = need;
    cqs_[slot].used += need;
    return q;
}

void HcaDevice::release_cq_room(const DeviceQp& q) {
    if (q.cq_slot < cqs_.size()) cqs_[q.cq_slot].used -= std::min(cqs_[q.cq_slot].used, q.cq_entries);
}

std::unique_ptr<DeviceMw> HcaDevice::alloc_mw(const std::shared_ptr<DevicePd>& pd, uint32_t type, int& err) {
    auto m = std::make_unique<DeviceMw>();
    m->mw = ibv_alloc_mw(pd->pd, ibv_mw_type(type));
    if (!m->mw) {
        err = errno ? errno : ENOMEM;
        LOG_WARN("hca %s: ibv_alloc_mw(type %u): %s", name_.c_str(), type, strerror(err));
        return nullptr;
    }
    m->pd = pd;
    return m;
}

std::unique_ptr<DeviceAh> HcaDevice::create_ah(const std::shared_ptr<DevicePd>& pd, const uint8_t* gid,
                                               const abi::AhAttr& guest, int& err) {
    ibv_ah_attr a{};
    a.is_global = 1;
    std::memcpy(a.grh.dgid.raw, gid, 16);
    a.grh.sgid_index = uint8_t(gid_index_);
    a.grh.hop_limit = guest.is_global && guest.hop_limit ? guest.hop_limit : 64;
    a.grh.traffic_class = guest.is_global ? guest.traffic_class : 0;
    a.sl = guest.sl;
    a.port_num = port_;
    auto d = std::make_unique<DeviceAh>();
    d->ah = ibv_create_ah(pd->pd, &a);
    if (!d->ah) {
        err = errno ? errno : ENOMEM;
        LOG_WARN("hca %s: ibv_create_ah: %s", name_.c_str(), strerror(err));
        return nullptr;
    }
    d->pd = pd;
    std::memcpy(d->gid, gid, 16);
    return d;
}

int HcaDevice::to_rtr(DeviceQp& q, const abi::QpAttr& a, const uint8_t* peer_gid) {
    const bool ud = q.qp->qp_type == IBV_QPT_UD;
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = 0;  // partitions are the shims' (hca_bind.cpp): only default-partition guests use the device
    init.port_num = port_;
    init.qp_access_flags = a.qp_access_flags;
    init.qkey = a.qkey;
    if (int rc = modify(q.qp, init,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS),
                        "INIT"))
        return rc;
    q.qkey = a.qkey;
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTR;
    if (ud) return modify(q.qp, r, IBV_QP_STATE, "RTR");  // a UD QP's paths are its datagrams' AHs
    r.path_mtu = ibv_mtu(std::min<uint32_t>(a.path_mtu ? a.path_mtu : uint32_t(IBV_MTU_1024), uint32_t(active_mtu_)));
    r.dest_qp_num = a.dest_qp_num;
    r.rq_psn = a.rq_psn;
    r.max_dest_rd_atomic = uint8_t(std::min<int>(a.max_dest_rd_atomic, attr_.max_qp_rd_atom));
    r.min_rnr_timer = a.min_rnr_timer;
    r.ah_attr.is_global = 1;
    std::memcpy(r.ah_attr.grh.dgid.raw, peer_gid, 16);
    r.ah_attr.grh.sgid_index = uint8_t(gid_index_);
    r.ah_attr.grh.hop_limit = 64;
    r.ah_attr.sl = a.ah.sl;
    r.ah_attr.port_num = port_;
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (q.qp->qp_type == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    return modify(q.qp, r, mask, "RTR");
}

int HcaDevice::to_rts(DeviceQp& q, const abi::QpAttr& a) {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    r.sq_psn = a.sq_psn;
    int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (q.qp->qp_type == IBV_QPT_RC) {
        r.timeout = a.timeout;
        // rxe retries without end when retry_cnt is 7 (rxe_comp.c treats it
        // like rnr_retry 7); a hardware HCA gives up after 7 retries.
        // On rxe 7 would mean "forever": a dead peer must end in
        // IBV_WC_RETRY_EXC_ERR, as on an HCA, so rxe gets 6.
        r.retry_cnt = attr_.vendor_id == kRxeVendorId ? std::min<uint8_t>(a.retry_cnt, 6) : a.retry_cnt;
        r.rnr_retry = a.rnr_retry;
        r.max_rd_atomic = uint8_t(std::min<int>(a.max_rd_atomic, attr_.max_qp_rd_atom));
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    return modify(q.qp, r, mask, "RTS");
}

int HcaDevice::set_qkey(DeviceQp& q, uint32_t qkey) {
    ibv_qp_attr r{};
    r.qkey = qkey;
    int rc = modify(q.qp, r, IBV_QP_QKEY, "a new Q_Key");
    if (!rc) q.qkey = qkey;
    return rc;
}

int HcaDevice::post_send(DeviceQp& q, const SendWork& w, uint32_t idx, const SendTargets& t) {
    ibv_sge sge[abi::kMaxSge];
    ibv_send_wr wr{};
    wr.wr_id = make_wr_id(false, q.gen, idx);
    wr.opcode = ibv_wr_opcode(w.hdr.opcode);
    // Every request is signaled on the device: each guest WQE completes on
    // its own completion (the guest's signaling decides its CQE).
    wr.send_flags = IBV_SEND_SIGNALED | (w.hdr.send_flags & (IBV_SEND_SOLICITED | IBV_SEND_FENCE));
    if (w.hdr.opcode == IBV_WR_BIND_MW) return post_bind(q, w, wr, t);
    wr.imm_data = w.hdr.imm_data;
    if (w.is_inline) {
        // The device copies inline data when it is posted: a WQE, not a payload.
        sge[0] = ibv_sge{reinterpret_cast<uint64_t>(w.inline_data), w.inline_len, 0};
        wr.num_sge = w.inline_len ? 1 : 0;
        wr.send_flags |= IBV_SEND_INLINE;
    } else {
        wr.num_sge = to_ibv_sges(w.sge, w.num_sge, sge);
    }
    wr.sg_list = sge;
    if (w.hdr.opcode == IBV_WR_LOCAL_INV || w.hdr.opcode == IBV_WR_SEND_WITH_INV) wr.invalidate_rkey = w.hdr.rkey;
    if (t.ah) {
        wr.wr.ud.ah = t.ah;
        wr.wr.ud.remote_qpn = w.hdr.remote_qpn;
        wr.wr.ud.remote_qkey = t.qkey;
    } else if (w.hdr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.hdr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        wr.wr.atomic.remote_addr = w.hdr.remote_addr;
        wr.wr.atomic.rkey = w.hdr.rkey;
        wr.wr.atomic.compare_add = w.hdr.compare_add;
        wr.wr.atomic.swap = w.hdr.swap;
    } else {
        wr.wr.rdma.remote_addr = w.hdr.remote_addr;
        wr.wr.rdma.rkey = w.hdr.rkey;
    }
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(q.qp, &wr, &bad);
    if (rc) LOG_WARN("hca %s: QP %u: ibv_post_send: %s", name_.c_str(), q.qp->qp_num, strerror(rc));
    return rc;
}

int HcaDevice::post_bind(DeviceQp& q, const SendWork& w, ibv_send_wr& wr, const SendTargets& t) {
    ibv_mw_bind_info info{};
    info.mr = t.mr;
    if (!t.mr) {
        // An unbind (length 0): the device ignores the MR, but rxe's
        // provider reads its lkey.
        DevicePd& pd = *q.pd;
        if (!pd.unbind_mr) pd.unbind_mr = ibv_reg_mr(pd.pd, &pd.unbind_byte, 1, int(IBV_ACCESS_LOCAL_WRITE));
        if (!pd.unbind_mr) return errno ? errno : ENOMEM;
        info.mr = pd.unbind_mr;
    }
    info.addr = t.mr ? w.hdr.remote_addr : 0;
    info.length = t.mr ? w.hdr.compare_add : 0;
    info.mw_access_flags = w.hdr.mw_access;
    int rc;
    if (t.mw->type == IBV_MW_TYPE_1) {
        // ibv_bind_mw takes the next key itself (ibv_inc_rkey of the
        // window's): give it the one before the guest's, which the guest's
        // provider picked the same way.
        t.mw->rkey = (w.hdr.rkey & 0xffffff00u) | ((w.hdr.rkey - 1) & 0xffu);
        ibv_mw_bind b{};
        b.wr_id = wr.wr_id;
        b.send_flags = wr.send_flags;
        b.bind_info = info;
        rc = ibv_bind_mw(q.qp, t.mw, &b);
    } else {
        wr.bind_mw.mw = t.mw;
        wr.bind_mw.rkey = w.hdr.rkey;
        wr.bind_mw.bind_info = info;
        ibv_send_wr* bad = nullptr;
        rc = ibv_post_send(q.qp, &wr, &bad);
    }
    if (rc) LOG_WARN("hca %s: QP %u: binding a window: %s", name_.c_str(), q.qp->qp_num, strerror(rc));
    return rc;
}

int HcaDevice::post_recv(DeviceQp& q, const RecvWork& w, uint32_t idx) {
    ibv_sge sge[abi::kMaxSge];
    ibv_recv_wr wr{};
    ibv_sge sge_ud[abi::kMaxSge + 1];
    wr.wr_id = make_wr_id(true, q.gen, idx);
    if (q.headers) {
        wr.sg_list = sge_ud;
        wr.num_sge = to_ud_recv_sges(*q.headers, idx, w.sge, w.num_sge, sge_ud);
    } else {
        wr.sg_list = sge;
        wr.num_sge = to_ibv_sges(w.sge, w.num_sge, sge);
    }
    ibv_recv_wr* bad = nullptr;
    int rc = ibv_post_recv(q.qp, &wr, &bad);
    if (rc) LOG_WARN("hca %s: QP %u: ibv_post_recv: %s", name_.c_str(), q.qp->qp_num, strerror(rc));
    else ++stats_.recvs;
    return rc;
}

int HcaDevice::post_srq_recv(DeviceSrq& s, const RecvWork& w) {
    if (s.free.empty()) return ENOSPC;
    const uint32_t slot = s.free.back();
    ibv_sge sge[abi::kMaxSge + 1];
    ibv_recv_wr wr{};
    wr.wr_id = make_wr_id(true, s.id, slot) | kSrqBit;
    wr.sg_list = sge;
    wr.num_sge = s.headers ? to_ud_recv_sges(*s.headers, slot, w.sge, w.num_sge, sge)
                           : to_ibv_sges(w.sge, w.num_sge, sge);
    ibv_recv_wr* bad = nullptr;
    int rc = ibv_post_srq_recv(s.srq, &wr, &bad);
    if (rc) {
        LOG_WARN("hca %s: ibv_post_srq_recv: %s", name_.c_str(), strerror(rc));
        return rc;
    }
    s.free.pop_back();
    s.wr_ids[slot] = w.wr_id;
    s.nsge[slot] = uint8_t(std::min(w.num_sge, s.max_sge));
    std::copy_n(w.sge, s.nsge[slot], s.sges.begin() + ptrdiff_t(uint64_t(slot) * s.max_sge));
    s.on_device[slot] = 1;
    ++stats_.recvs;
    return 0;
}

bool HcaDevice::poll(Engine& eng) {
    bool any = false;
    for (auto& c : cqs_) {
        int n = ibv_poll_cq(c.cq, int(wcs_.size()), wcs_.data());
        if (n < 0) {
            LOG_ERR("hca %s: ibv_poll_cq: %d", name_.c_str(), n);
            continue;
        }
        for (int i = 0; i < n; ++i) {
            const ibv_wc& wc = wcs_[i];
            ++stats_.completions;
            if (wc.status != IBV_WC_SUCCESS) ++stats_.errors;
            DeviceCompletion dc;
            dc.qpn = wc.qp_num;
            dc.recv = (wc.wr_id & kRecvBit) != 0;
            dc.gen = uint32_t(wc.wr_id >> 32) & DeviceQp::kGenMask;
            dc.idx = uint32_t(wc.wr_id);
            dc.wc = &wc;
            if (wc.wr_id & kSrqBit) {
                // The slot goes back first, whatever became of the QP.
                dc.srq = srq_by_id(dc.gen);
                if (!dc.srq || !dc.srq->take_back(dc.idx)) continue;
                dc.srq_wr_id = dc.srq->wr_ids[dc.idx];
            }
            deliver_device_completion(*this, eng, dc);
        }
        any |= n > 0;
    }
    return any;
}

void HcaDevice::arm() {
    for (auto& c : cqs_) ibv_req_notify_cq(c.cq, 0);
}

void HcaDevice::consume_events() {
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    while (ibv_get_cq_event(channel_, &cq, &cq_ctx) == 0) ibv_ack_cq_events(cq, 1);
}

void HcaDevice::handle_async(Engine& eng) {
    ibv_async_event ev;
    while (ibv_get_async_event(ctx_, &ev) == 0) {
        deliver_device_event(eng, *this, ev);
        ibv_ack_async_event(&ev);
    }
}

}  // namespace vrdma::shim
