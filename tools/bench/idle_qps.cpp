// vrdma-idle-qps: RC ping-pong latency between two devices while one of them
// holds many idle QPs (the cost of finding work, issue 13). Run under
//   vrdma-run --guest a --guest b -- vrdma-idle-qps [IDLE...]
// which gives this process vrdma0 (guest a) and vrdma1 (guest b). Thread 1
// on vrdma0 and thread 2 on vrdma1 bounce an 8-byte SEND; before each
// measurement vrdma0's context gets more QPs that never carry traffic
// (RC, brought to RTS like the MPI and UCX QPs of a real job, most of them
// idle). Prints one line per count: idle QPs and one-way latency (us).
// With --contexts N,... it then opens more contexts on vrdma0 (each with a
// PD, a CQ and an RC QP at RTS, never used: the devices of the other
// processes of a job, or of other tenants) and prints one line per count.
#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int kIters = 4000;  // round trips a round
constexpr int kRounds = 5;    // a figure is the median of its rounds

struct End {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_mr* mr = nullptr;
    char* buf = nullptr;  // heap memory (registrable by every vrdma version)
    uint16_t lid = 0;
};

void die(const char* what) {
    std::perror(what);
    std::exit(1);
}

ibv_qp* make_qp(End& e) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = e.cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(e.pd, &a);
    if (!qp) die("ibv_create_qp");
    return qp;
}

// RESET -> INIT -> RTR -> RTS, connected to (dlid, dqpn).
void connect(ibv_qp* qp, uint16_t dlid, uint32_t dqpn) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dqpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.dlid = dlid;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("RTR");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC))
        die("RTS");
}

void open_end(ibv_device* dev, End& e) {
    e.ctx = ibv_open_device(dev);
    if (!e.ctx) die("ibv_open_device");
    e.pd = ibv_alloc_pd(e.ctx);
    e.cq = ibv_create_cq(e.ctx, 64, nullptr, nullptr, 0);
    if (!e.pd || !e.cq) die("pd/cq");
    e.buf = static_cast<char*>(std::aligned_alloc(4096, 4096));
    if (!e.buf) die("aligned_alloc");
    e.mr = ibv_reg_mr(e.pd, e.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
    if (!e.mr) die("ibv_reg_mr");
    ibv_port_attr pa{};
    if (ibv_query_port(e.ctx, 1, &pa)) die("ibv_query_port");
    e.lid = pa.lid;
    e.qp = make_qp(e);
}

void post_recv(End& e) {
    ibv_sge s{reinterpret_cast<uintptr_t>(e.buf), 8, e.mr->lkey};
    ibv_recv_wr wr{}, *bad;
    wr.sg_list = &s;
    wr.num_sge = 1;
    if (ibv_post_recv(e.qp, &wr, &bad)) die("ibv_post_recv");
}

void post_send(End& e) {
    ibv_sge s{reinterpret_cast<uintptr_t>(e.buf), 8, e.mr->lkey};
    ibv_send_wr wr{}, *bad;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    if (ibv_post_send(e.qp, &wr, &bad)) die("ibv_post_send");
}

// Waits for `n` completions (the send's and the receive's), all successful.
void reap(End& e, int n) {
    ibv_wc wc[4];
    while (n > 0) {
        int got = ibv_poll_cq(e.cq, n < 4 ? n : 4, wc);  // never more: the next one is the next step's
        if (got < 0) die("ibv_poll_cq");
        for (int i = 0; i < got; ++i)
            if (wc[i].status != IBV_WC_SUCCESS) {
                std::fprintf(stderr, "vrdma-idle-qps: completion error %s\n", ibv_wc_status_str(wc[i].status));
                std::exit(1);
            }
        n -= got;
    }
}

// One side of kIters round trips: `first` sends first. Each side starts
// and ends with a receive posted (main posts the first).
void bounce(End& e, bool first, std::atomic<int>& ready) {
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();
    for (int i = 0; i < kIters; ++i) {
        if (first) {
            post_send(e);
            reap(e, 2);
            post_recv(e);
        } else {
            reap(e, 1);
            post_recv(e);
            post_send(e);
            reap(e, 1);
        }
    }
}

// kIters round trips driven by one thread: a sends, b's receive is reaped
// and b answers, a reaps its send and the answer, b its send. Only one
// thread of the client is runnable: with the shim's worker, two, so on a
// 2-core host each has a core (the shape of a many-core host's ping-pong).
void bounce_one_thread(End& a, End& b) {
    for (int i = 0; i < kIters; ++i) {
        post_send(a);
        reap(b, 1);
        post_recv(b);
        post_send(b);
        reap(a, 2);
        post_recv(a);
        reap(b, 1);
    }
}

// One-way latency (us) between a and b: the median of kRounds rounds of
// kIters round trips (a round that shared its core with the shim's worker
// or was preempted does not move it), from two threads or, with
// `one_thread`, from this one.
double measure(End& a, End& b, bool one_thread) {
    double r[kRounds];
    for (double& v : r) {
        std::atomic<int> ready{0};
        auto t0 = std::chrono::steady_clock::now();
        if (one_thread) {
            bounce_one_thread(a, b);
        } else {
            std::thread tb([&] { bounce(b, false, ready); });
            bounce(a, true, ready);
            tb.join();
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        v = s * 1e6 / kIters / 2;
    }
    std::sort(r, r + kRounds);
    return r[kRounds / 2];
}

std::vector<long> parse_counts(const char* list) {
    std::vector<long> v;
    for (const char* p = list; *p;) {
        char* end = nullptr;
        long n = std::strtol(p, &end, 10);
        if (end == p || n < 0) {
            std::fprintf(stderr, "vrdma-idle-qps: bad count list '%s' (expected N,N,...)\n", list);
            std::exit(2);
        }
        v.push_back(n);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            std::fprintf(stderr, "vrdma-idle-qps: bad count list '%s' (expected N,N,...)\n", list);
            std::exit(2);
        }
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
        std::printf(
            "usage: vrdma-run --guest a --guest b -- vrdma-idle-qps [--one-thread] [--contexts N,...]\n"
            "                                                       [IDLE...]\n"
            "RC ping-pong of 8 bytes between vrdma0 and vrdma1 (two threads) while\n"
            "vrdma0's context holds IDLE connected but idle RC QPs (default: 0 1000\n"
            "4000, in that order; each count adds QPs to the previous ones).\n"
            "Prints: idle-qps COUNT VALUE us (one-way latency: the median of %d\n"
            "rounds, each the average of %d round trips).\n"
            "--contexts N,...  then (the idle QPs destroyed) opens more contexts\n"
            "        on vrdma0, each with a PD, a CQ and an RC QP at RTS that never\n"
            "        carry traffic, up to each count in turn, and prints\n"
            "        idle-contexts COUNT VALUE us.\n"
            "--one-thread  one thread drives both ends in turn (send, reap, answer),\n"
            "        so the client has one runnable thread, not two: beside the\n"
            "        shim's worker, a core each on a 2-core host.\n",
            kRounds, kIters);
        return 0;
    }
    std::vector<long> counts, context_counts;
    bool one_thread = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--one-thread")) {
            one_thread = true;
            continue;
        }
        if (!std::strcmp(argv[i], "--contexts") && i + 1 < argc) {
            context_counts = parse_counts(argv[++i]);
            continue;
        }
        counts.push_back(parse_counts(argv[i]).at(0));
    }
    if (counts.empty() && context_counts.empty()) counts = {0, 1000, 4000};

    int n = 0;
    ibv_device** devs = ibv_get_device_list(&n);
    if (!devs || n < 2) {
        std::fprintf(stderr, "vrdma-idle-qps: needs two devices (vrdma-run --guest a --guest b)\n");
        return 2;
    }
    End a, b;
    open_end(devs[0], a);
    open_end(devs[1], b);
    connect(a.qp, b.lid, b.qp->qp_num);
    connect(b.qp, a.lid, a.qp->qp_num);
    post_recv(a);  // the receive each side keeps posted between round trips
    post_recv(b);

    // Idle QPs in a's context, connected in pairs to QPs of b (RTS: real
    // jobs keep their QPs connected), never used.
    std::vector<ibv_qp*> idle_a, idle_b;
    for (long want : counts) {
        while (long(idle_a.size()) < want) {
            ibv_qp* qa = make_qp(a);
            ibv_qp* qb = make_qp(b);
            connect(qa, b.lid, qb->qp_num);
            connect(qb, a.lid, qa->qp_num);
            idle_a.push_back(qa);
            idle_b.push_back(qb);
        }
        std::printf("idle-qps %zu %.2f us\n", idle_a.size(), measure(a, b, one_thread));
        std::fflush(stdout);
    }
    for (ibv_qp* q : idle_a) ibv_destroy_qp(q);
    for (ibv_qp* q : idle_b) ibv_destroy_qp(q);

    // Idle contexts on vrdma0, each with a QP at RTS connected to b's.
    std::vector<End> idle_ctx;
    idle_ctx.reserve(context_counts.empty() ? 0 : size_t(context_counts.back()));
    for (long want : context_counts) {
        while (long(idle_ctx.size()) < want) {
            idle_ctx.emplace_back();
            open_end(devs[0], idle_ctx.back());
            connect(idle_ctx.back().qp, b.lid, b.qp->qp_num);
        }
        std::printf("idle-contexts %zu %.2f us\n", idle_ctx.size(), measure(a, b, one_thread));
        std::fflush(stdout);
    }
    for (End& e : idle_ctx) ibv_destroy_qp(e.qp);
    ibv_destroy_qp(a.qp);
    ibv_destroy_qp(b.qp);
    std::vector<End*> ends{&a, &b};
    for (End& e : idle_ctx) ends.push_back(&e);
    for (End* e : ends) {
        ibv_dereg_mr(e->mr);
        ibv_destroy_cq(e->cq);
        ibv_dealloc_pd(e->pd);
        ibv_close_device(e->ctx);
        std::free(e->buf);
    }
    ibv_free_device_list(devs);
    return 0;
}
