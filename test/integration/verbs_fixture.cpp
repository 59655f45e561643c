#include "verbs_fixture.h"

#include <sys/mman.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

namespace vt {

namespace {
[[noreturn]] void die(const std::string& what) {
    throw std::runtime_error(what + ": " + std::strerror(errno));
}
}  // namespace

bool through_rxe() {
    const char* v = std::getenv("VRDMA_TEST_THROUGH_RXE");
    return v && *v && std::string(v) != "0";
}

std::string peer_device_name() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) die("no RDMA device (run under vrdma-run)");
    bool second = false;
    for (int i = 0; i < n; ++i) second |= std::string(ibv_get_device_name(list[i])) == "vrdma1";
    ibv_free_device_list(list);
    return second ? "vrdma1" : "vrdma0";
}

Device::Device(Role role) : name(role == kPeer ? peer_device_name() : "vrdma0") {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list || n < 1) die("no RDMA device (run under vrdma-run)");
    for (int i = 0; i < n && !ctx; ++i)
        if (ibv_get_device_name(list[i]) == name) ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx) die("cannot open " + name);
    pd = ibv_alloc_pd(ctx);
    if (!pd) die("ibv_alloc_pd");
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, 1, &pa)) die("ibv_query_port");
    lid = pa.lid;
}

Device::~Device() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
}

Buffer::Buffer(ibv_pd* pd, size_t sz, int access) : size(sz) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, (sz + 4095) / 4096 * 4096));
    std::memset(data, 0, sz);
    mr = ibv_reg_mr(pd, data, sz, access);
    if (!mr) die("ibv_reg_mr");
}

Buffer::~Buffer() {
    if (mr) ibv_dereg_mr(mr);
    std::free(data);
}

Qp::Qp(Device& dev, const QpOptions& opt) {
    owns_cqs = !opt.send_cq;
    send_cq = owns_cqs ? ibv_create_cq(dev.ctx, 256, nullptr, nullptr, 0) : opt.send_cq;
    recv_cq = owns_cqs ? ibv_create_cq(dev.ctx, 256, nullptr, nullptr, 0) : opt.recv_cq;
    if (!send_cq || !recv_cq) die("ibv_create_cq");
    ibv_qp_init_attr ia{};
    ia.send_cq = send_cq;
    ia.recv_cq = recv_cq;
    ia.srq = opt.srq;
    ia.qp_type = opt.type;
    ia.sq_sig_all = opt.sq_sig_all;
    ia.cap.max_send_wr = opt.max_send_wr;
    ia.cap.max_recv_wr = opt.srq ? 0 : opt.max_recv_wr;
    ia.cap.max_send_sge = opt.max_sge;
    ia.cap.max_recv_sge = opt.srq ? 0 : opt.max_sge;
    ia.cap.max_inline_data = opt.max_inline;
    qp = ibv_create_qp(dev.pd, &ia);
    if (!qp) die("ibv_create_qp");
}

Qp::~Qp() {
    if (qp) ibv_destroy_qp(qp);
    if (send_cq && owns_cqs) ibv_destroy_cq(send_cq);
    if (recv_cq && owns_cqs) ibv_destroy_cq(recv_cq);
}

void connect_rc(ibv_qp* qp, uint16_t lid, uint32_t remote_qpn, const RcParams& p) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = p.access;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("modify to INIT");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = p.min_rnr_timer;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("modify to RTR");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.max_rd_atomic = 4;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_MAX_QP_RD_ATOMIC))
        die("modify to RTS");
}

void uc_init(ibv_qp* qp, int access) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = access;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("UC INIT");
}

void uc_rtr(ibv_qp* qp, uint16_t lid, uint32_t remote_qpn) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
        die("UC RTR");
}

void uc_rts(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) die("UC RTS");
}

void connect_uc(ibv_qp* qp, uint16_t lid, uint32_t remote_qpn) {
    uc_init(qp);
    uc_rtr(qp, lid, remote_qpn);
    uc_rts(qp);
}

void bring_up_ud(ibv_qp* qp, uint32_t qkey) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = qkey;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) die("UD INIT");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) die("UD RTR");
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) die("UD RTS");
}

ibv_qp_state qp_state(ibv_qp* qp) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia)) die("ibv_query_qp");
    return a.qp_state;
}

std::optional<ibv_wc> poll_one(ibv_cq* cq, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    ibv_wc wc{};
    for (;;) {
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0) die("ibv_poll_cq");
        if (n == 1) return wc;
        if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
        std::this_thread::yield();
    }
}

bool cq_stays_empty(ibv_cq* cq, int ms) { return !poll_one(cq, ms).has_value(); }

int post_recv(ibv_qp* qp, uint64_t wr_id, std::vector<ibv_sge> sges) {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = sges.data();
    wr.num_sge = static_cast<int>(sges.size());
    return ibv_post_recv(qp, &wr, &bad);
}

int post_send(ibv_qp* qp, ibv_send_wr wr, std::vector<ibv_sge> sges) {
    ibv_send_wr* bad = nullptr;
    wr.sg_list = sges.data();
    wr.num_sge = static_cast<int>(sges.size());
    return ibv_post_send(qp, &wr, &bad);
}

ibv_sge sge(const Buffer& b, size_t off, uint32_t len) {
    return ibv_sge{b.addr(off), len, b.mr->lkey};
}

void pattern(uint8_t* p, size_t n, uint8_t seed) {
    for (size_t i = 0; i < n; ++i) p[i] = uint8_t(seed + i * 13 + (i >> 8));
}

bool has_pattern(const uint8_t* p, size_t n, uint8_t seed) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != uint8_t(seed + i * 13 + (i >> 8))) return false;
    return true;
}

uint32_t complete(ibv_cq* cq) {
    auto wc = poll_one(cq, 5000);
    return wc ? wc->status : 0xffff;
}

uint32_t peer_rdma(RcPair& p, ibv_wr_opcode op, uint64_t remote, uint32_t rkey, Buffer& other, size_t len) {
    ibv_send_wr w{};
    w.opcode = op;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = remote;
    w.wr.rdma.rkey = rkey;
    if (int rc = post_send(p.b.qp, w, {sge(other, 0, uint32_t(len))})) {
        errno = rc;
        die("ibv_post_send of the peer's RDMA request");
    }
    return complete(p.b.send_cq);
}

}  // namespace vt
