// vrdma-greedy-guest: a tenant that asks the shim for as much work as the
// verbs allow, for fairness.sh (docs/protocol.md "Work per turn"). It uses
// only ordinary verbs, nothing malformed: what it does is legal, just large.
//
//   vrdma-greedy-guest [-d DEV] [-S SECONDS] [-g SGES] [-f DEPTH]
//
// Two loopback RC connections inside this one process:
//   bulk   SENDs of the largest message the port allows (2 GiB: 32 SGEs of
//          64 MiB, each over the same send buffer) into receives of 32 SGEs
//          over a second 64 MiB buffer; two in flight at all times. -g SGES
//          (1 to 32) makes them SGES times 64 MiB.
//   flood  8-byte RDMA WRITEs, 1024 in flight at all times (-f DEPTH: that
//          many, 0 to 1024; 0: no flood).
// Every completion must be IBV_WC_SUCCESS. Between empty polls it sleeps
// 100 us: its claim on the host's CPUs is the kernel's to limit (cgroups);
// this program tests the claim on the shim.
//
// Output: one line at the end,
//   greedy: 12 bulk messages (24.0 GiB), 81920 small writes in 10.0 s
// Exit status 0; 1 on a failed completion (named), 3 on a setup failure.
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBufBytes = 64ull << 20;
constexpr uint32_t kBulkSges = 32;
constexpr uint32_t kBulkDepth = 2;
constexpr uint32_t kFloodDepth = 1024;
constexpr uint64_t kFloodTag = 1ull << 63;

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "greedy: %s: %s\n", what, std::strerror(errno));
    std::exit(3);
}

ibv_qp* make_qp(ibv_pd* pd, ibv_cq* cq, uint32_t send_wr, uint32_t recv_wr, uint32_t sge) {
    ibv_qp_init_attr a{};
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = send_wr;
    a.cap.max_recv_wr = recv_wr;
    a.cap.max_send_sge = sge;
    a.cap.max_recv_sge = sge;
    ibv_qp* qp = ibv_create_qp(pd, &a);
    if (!qp) die("ibv_create_qp");
    return qp;
}

// INIT -> RTR -> RTS, connected to `peer_qpn` on this port (`lid`).
void connect(ibv_qp* qp, uint32_t peer_qpn, uint16_t lid) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("modify to INIT");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("modify to RTR");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 20;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC))
        die("modify to RTS");
}

}  // namespace

int main(int argc, char** argv) {
    std::string dev_name = "vrdma0";
    double seconds = 10;
    uint32_t bulk_sges = kBulkSges, flood_depth = kFloodDepth;
    for (int c; (c = getopt(argc, argv, "d:S:g:f:h")) != -1;) {
        if (c == 'd') {
            dev_name = optarg;
        } else if (c == 'S') {
            seconds = std::atof(optarg);
        } else if (c == 'g' && std::atoi(optarg) >= 1 && std::atoi(optarg) <= int(kBulkSges)) {
            bulk_sges = uint32_t(std::atoi(optarg));
        } else if (c == 'f' && std::atoi(optarg) >= 0 && std::atoi(optarg) <= int(kFloodDepth)) {
            flood_depth = uint32_t(std::atoi(optarg));
        } else {
            std::fprintf(stderr, "usage: %s [-d DEVICE] [-S SECONDS] [-g SGES 1..32] [-f DEPTH 0..1024]\n", argv[0]);
            return c == 'h' ? 0 : 3;
        }
    }
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ibv_device* dev = nullptr;
    for (int i = 0; list && i < n; ++i)
        if (dev_name == ibv_get_device_name(list[i])) dev = list[i];
    if (!dev) die("device not found");
    ibv_context* ctx = ibv_open_device(dev);
    if (!ctx) die("ibv_open_device");
    ibv_port_attr port{};
    if (ibv_query_port(ctx, 1, &port)) die("ibv_query_port");
    ibv_pd* pd = ibv_alloc_pd(ctx);
    if (!pd) die("ibv_alloc_pd");
    std::vector<char> src(kBufBytes, 's'), dst(kBufBytes);
    ibv_mr* smr = ibv_reg_mr(pd, src.data(), kBufBytes, IBV_ACCESS_LOCAL_WRITE);
    ibv_mr* dmr = ibv_reg_mr(pd, dst.data(), kBufBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!smr || !dmr) die("ibv_reg_mr");
    ibv_cq* cq = ibv_create_cq(ctx, 4096, nullptr, nullptr, 0);
    if (!cq) die("ibv_create_cq");

    // Twice the depth: a message's send slot is free again only once its
    // completion is polled, which may come after the receive's.
    ibv_qp* bulk_tx = make_qp(pd, cq, 2 * kBulkDepth, 1, kBulkSges);
    ibv_qp* bulk_rx = make_qp(pd, cq, 1, 2 * kBulkDepth, kBulkSges);
    ibv_qp* flood_tx = make_qp(pd, cq, kFloodDepth, 1, 1);
    ibv_qp* flood_rx = make_qp(pd, cq, 1, 1, 1);
    connect(bulk_tx, bulk_rx->qp_num, port.lid);
    connect(bulk_rx, bulk_tx->qp_num, port.lid);
    connect(flood_tx, flood_rx->qp_num, port.lid);
    connect(flood_rx, flood_tx->qp_num, port.lid);

    ibv_sge send_sges[kBulkSges], recv_sges[kBulkSges];
    for (uint32_t i = 0; i < kBulkSges; ++i) {
        send_sges[i] = {reinterpret_cast<uintptr_t>(src.data()), uint32_t(kBufBytes), smr->lkey};
        recv_sges[i] = {reinterpret_cast<uintptr_t>(dst.data()), uint32_t(kBufBytes), dmr->lkey};
    }
    auto post_bulk = [&] {
        ibv_recv_wr rwr{};
        rwr.sg_list = recv_sges;
        rwr.num_sge = int(bulk_sges);
        ibv_recv_wr* rbad;
        if (ibv_post_recv(bulk_rx, &rwr, &rbad)) die("ibv_post_recv (bulk)");
        ibv_send_wr wr{};
        wr.sg_list = send_sges;
        wr.num_sge = int(bulk_sges);
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad;
        if (ibv_post_send(bulk_tx, &wr, &bad)) die("ibv_post_send (bulk)");
    };
    ibv_sge flood_sge{reinterpret_cast<uintptr_t>(src.data()), 8, smr->lkey};
    auto post_flood = [&] {
        ibv_send_wr wr{};
        wr.wr_id = kFloodTag;
        wr.sg_list = &flood_sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
        wr.wr.rdma.rkey = dmr->rkey;
        ibv_send_wr* bad;
        if (ibv_post_send(flood_tx, &wr, &bad)) die("ibv_post_send (flood)");
    };
    uint64_t bulk_posted = 0, bulk_sent = 0, bulk_done = 0, flood_done = 0;
    // A message is done when both its completions were polled.
    auto refill_bulk = [&] {
        for (; bulk_posted - std::min(bulk_sent, bulk_done) < kBulkDepth; ++bulk_posted) post_bulk();
    };
    refill_bulk();
    for (uint32_t i = 0; i < flood_depth; ++i) post_flood();

    const auto start = Clock::now();
    const auto end = start + std::chrono::duration<double>(seconds);
    ibv_wc wc[64];
    while (Clock::now() < end) {
        int got = ibv_poll_cq(cq, 64, wc);
        if (got < 0) die("ibv_poll_cq");
        if (got == 0) usleep(100);
        for (int i = 0; i < got; ++i) {
            if (wc[i].status != IBV_WC_SUCCESS) {
                std::fprintf(stderr, "greedy: completion error %s (opcode %d)\n", ibv_wc_status_str(wc[i].status),
                             wc[i].opcode);
                return 1;
            }
            if (wc[i].wr_id == kFloodTag) {
                ++flood_done;
                post_flood();
            } else {
                ++(wc[i].opcode == IBV_WC_RECV ? bulk_done : bulk_sent);
                refill_bulk();
            }
        }
    }
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("greedy: %llu bulk messages (%.1f GiB), %llu small writes in %.1f s\n",
                static_cast<unsigned long long>(bulk_done), double(bulk_done) * bulk_sges * kBufBytes / (1 << 30),
                static_cast<unsigned long long>(flood_done), s);
    // Tear down with work in flight: destroying the QPs makes the shim
    // abandon the transfers they were moving (docs/protocol.md "Work per
    // turn"); everything is freed, so that LeakSanitizer stays quiet.
    for (ibv_qp* qp : {bulk_tx, bulk_rx, flood_tx, flood_rx})
        if (ibv_destroy_qp(qp)) die("ibv_destroy_qp");
    if (ibv_dereg_mr(smr) || ibv_dereg_mr(dmr)) die("ibv_dereg_mr");
    if (ibv_destroy_cq(cq)) die("ibv_destroy_cq");
    if (ibv_dealloc_pd(pd)) die("ibv_dealloc_pd");
    if (ibv_close_device(ctx)) die("ibv_close_device");
    ibv_free_device_list(list);
    return 0;
}
