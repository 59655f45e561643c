/*
 * vrdma-openib-check: does what Open MPI's openib BTL (v4.1, connection
 * manager udcm) does with an RDMA device before and while it carries MPI
 * traffic, one step at a time, and says which step fails and why. Run it
 * in a guest (vrdma-run --guest a -- vrdma-openib-check); vrdma-mpirun runs
 * it before mpirun and the MPI integration tests run it first, so that a
 * device openib cannot use gives a reason instead of Open MPI's "unable to
 * reach each other".
 *
 * Usage: vrdma-openib-check [-d DEVICE] [-q] [--no-channel]
 *   --no-channel  skip the completion channel (to check the rest without it)
 * Exit status: 0 all steps passed; 1 a step failed (the reason is printed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int quiet;
static int no_channel; /* --no-channel: skip the completion channel steps */
static const char *step = "";

static void begin(const char *s) { step = s; }
static void ok(void) {
    if (!quiet) printf("ok    %s\n", step);
}
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL  %s: ", step);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}
static int valid_width(uint8_t w) { return w == 1 || w == 2 || w == 4 || w == 8 || w == 16; }
static int valid_speed(uint8_t s) {
    return s == 1 || s == 2 || s == 4 || s == 8 || s == 16 || s == 32 || s == 64 || s == 128;
}

/* Wait for a completion on cq through its channel, as udcm's progress
 * thread does: poll() the channel fd, ibv_get_cq_event, ack, re-arm. */
static void wait_channel(struct ibv_comp_channel *ch, struct ibv_cq *cq) {
    struct pollfd p = {.fd = ch->fd, .events = POLLIN};
    int n = poll(&p, 1, 5000);
    if (n < 0) fail("poll on the completion channel fd %d: %s", ch->fd, strerror(errno));
    if (n == 0) fail("no completion event on the channel fd within 5 s (armed CQ got a completion)");
    struct ibv_cq *ev_cq = NULL;
    void *ev_ctx = NULL;
    if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx)) fail("ibv_get_cq_event: %s", strerror(errno));
    if (ev_cq != cq) fail("ibv_get_cq_event returned CQ %p, expected %p", (void *)ev_cq, (void *)cq);
    ibv_ack_cq_events(cq, 1);
}

static void poll_one(struct ibv_cq *cq, struct ibv_wc *wc, const char *what) {
    for (int i = 0; i < 5000000; ++i) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n < 0) fail("ibv_poll_cq: %d", n);
        if (n == 1) {
            if (wc->status != IBV_WC_SUCCESS)
                fail("%s completed with %s (%d)", what, ibv_wc_status_str(wc->status), wc->status);
            return;
        }
        if (i > 1000) usleep(10);
    }
    fail("%s: no completion", what);
}

static void to_rts_rc(struct ibv_qp *qp, uint16_t lid, uint32_t dest_qpn) {
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        fail("RC QP to INIT: %s", strerror(errno));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 25;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        fail("RC QP to RTR: %s", strerror(errno));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 20;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 4;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC))
        fail("RC QP to RTS: %s", strerror(errno));
}

int main(int argc, char **argv) {
    const char *want = NULL;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-d") && i + 1 < argc) want = argv[++i];
        else if (!strcmp(argv[i], "-q")) quiet = 1;
        else if (!strcmp(argv[i], "--no-channel")) no_channel = 1;
        else {
            fprintf(stderr, "usage: vrdma-openib-check [-d DEVICE] [-q] [--no-channel]\n");
            return 2;
        }
    }

    /* openib calls ibv_fork_init before any other verb (have_fork_support). */
    begin("ibv_fork_init (registered ranges get MADV_DONTFORK)");
    int rc = ibv_fork_init();
    if (rc) fail("returned %d (%s); openib would go on without fork support", rc, strerror(rc));
    ok();

    begin("$SYSFS_PATH/class/infiniband exists (openib disables itself silently otherwise)");
    const char *sysfs = getenv("SYSFS_PATH");
    char path[4096];
    snprintf(path, sizeof(path), "%s/class/infiniband", sysfs && *sysfs ? sysfs : "/sys");
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        fail("%s is missing: run the program through vrdma-run (it sets SYSFS_PATH)", path);
    ok();

    begin("device listed by libibverbs");
    int ndev = 0;
    struct ibv_device **list = ibv_get_device_list(&ndev);
    if (!list || ndev == 0)
        fail("libibverbs lists no RDMA device (is the shim serving this guest? is LD_PRELOAD/SYSFS_PATH set?)");
    struct ibv_device *dev = NULL;
    for (int i = 0; i < ndev; ++i)
        if (!want || !strcmp(ibv_get_device_name(list[i]), want)) {
            dev = list[i];
            break;
        }
    if (!dev) fail("no device named %s", want);
    const char *name = ibv_get_device_name(dev);
    if (!quiet) printf("      device %s\n", name);
    ok();

    begin("ibv_open_device, ibv_query_device");
    struct ibv_context *ctx = ibv_open_device(dev);
    if (!ctx) fail("%s", strerror(errno));
    struct ibv_device_attr da;
    if (ibv_query_device(ctx, &da)) fail("ibv_query_device: %s", strerror(errno));
    if (da.phys_port_cnt < 1) fail("no ports");
    if (da.atomic_cap == IBV_ATOMIC_NONE)
        fprintf(stderr, "note: atomic_cap NONE: openib offers no atomics, one-sided MPI (osc rdma) cannot use it\n");
    ok();

    begin("port 1: InfiniBand link layer, ACTIVE, standard width and speed, max_msg_sz > 0");
    struct ibv_port_attr pa;
    if (ibv_query_port(ctx, 1, &pa)) fail("ibv_query_port: %s", strerror(errno));
    if (pa.link_layer != IBV_LINK_LAYER_INFINIBAND && pa.link_layer != IBV_LINK_LAYER_UNSPECIFIED)
        fail("link layer %d is not InfiniBand: udcm, openib's only connection manager, refuses it", pa.link_layer);
    if (pa.state != IBV_PORT_ACTIVE) fail("port state %s, openib needs ACTIVE", ibv_port_state_str(pa.state));
    if (!valid_width(pa.active_width)) fail("active_width %u is not an IB width (1,2,4,8,16)", pa.active_width);
    if (!valid_speed(pa.active_speed)) fail("active_speed %u is not an IB speed", pa.active_speed);
    if (pa.max_msg_sz == 0) fail("max_msg_sz is 0: openib limits every RDMA to it");
    if (pa.lid == 0) fail("LID 0: udcm addresses peers by LID");
    ok();

    begin("ibv_query_gid(port 1, index 0), ibv_query_pkey(port 1, index 0)");
    union ibv_gid gid;
    if (ibv_query_gid(ctx, 1, 0, &gid)) fail("ibv_query_gid: %s", strerror(errno));
    uint16_t pkey;
    if (ibv_query_pkey(ctx, 1, 0, &pkey)) fail("ibv_query_pkey: %s", strerror(errno));
    ok();

    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    if (!pd) fail("ibv_alloc_pd: %s", strerror(errno));

    begin("ibv_create_comp_channel (udcm's progress thread polls its fd)");
    struct ibv_comp_channel *ch = no_channel ? NULL : ibv_create_comp_channel(ctx);
    if (no_channel)
        step = "ibv_create_comp_channel SKIPPED (--no-channel)";
    else if (!ch)
        fail("%s: completion channels are not available for this device, udcm cannot start", strerror(errno));
    if (ch && ch->fd < 0) fail("channel fd %d", ch->fd);
    ok();

    begin("UD QP and address handle, send to self, completion event through the channel");
    struct ibv_cq *rcq = ibv_create_cq(ctx, 512, NULL, ch, 0);
    struct ibv_cq *scq = ibv_create_cq(ctx, 512, NULL, NULL, 0);
    if (!rcq || !scq) fail("ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr qia = {0};
    qia.send_cq = scq;
    qia.recv_cq = rcq;
    qia.qp_type = IBV_QPT_UD;
    qia.cap.max_send_wr = 512;
    qia.cap.max_recv_wr = 512;
    qia.cap.max_send_sge = 1;
    qia.cap.max_recv_sge = 1;
    struct ibv_qp *ud = ibv_create_qp(pd, &qia);
    if (!ud) fail("ibv_create_qp(UD): %s", strerror(errno));
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qkey = 0;
    if (ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
        fail("UD to INIT: %s", strerror(errno));
    a.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(ud, &a, IBV_QP_STATE)) fail("UD to RTR: %s", strerror(errno));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    if (ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) fail("UD to RTS: %s", strerror(errno));
    size_t ubytes = 2 * 4096;
    char *ubuf = calloc(1, ubytes);
    struct ibv_mr *umr = ibv_reg_mr(pd, ubuf, ubytes, IBV_ACCESS_LOCAL_WRITE);
    if (!umr) fail("ibv_reg_mr: %s", strerror(errno));
    struct ibv_ah_attr aha = {0};
    aha.dlid = pa.lid;
    aha.port_num = 1;
    aha.is_global = 0; /* LID routed: same GID */
    struct ibv_ah *ah = ibv_create_ah(pd, &aha);
    if (!ah) fail("ibv_create_ah(dlid %u): %s", pa.lid, strerror(errno));
    if (ch && ibv_req_notify_cq(rcq, 0)) fail("ibv_req_notify_cq: %s", strerror(errno));
    struct ibv_sge rsge = {(uintptr_t)ubuf, 4096, umr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rsge, .num_sge = 1}, *bad_r;
    if (ibv_post_recv(ud, &rwr, &bad_r)) fail("ibv_post_recv(UD): %s", strerror(errno));
    strcpy(ubuf + 4096, "udcm hello");
    struct ibv_sge ssge = {(uintptr_t)(ubuf + 4096), 64, umr->lkey};
    struct ibv_send_wr swr = {0}, *bad_s;
    swr.wr_id = 2;
    swr.sg_list = &ssge;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    swr.wr.ud.ah = ah;
    swr.wr.ud.remote_qpn = ud->qp_num;
    swr.wr.ud.remote_qkey = 0;
    if (ibv_post_send(ud, &swr, &bad_s)) fail("ibv_post_send(UD): %s", strerror(errno));
    if (ch) wait_channel(ch, rcq);
    struct ibv_wc wc;
    poll_one(rcq, &wc, "UD receive");
    if (wc.byte_len != 40 + 64 || strcmp(ubuf + 40, "udcm hello"))
        fail("UD receive: byte_len %u, payload '%.10s'", wc.byte_len, ubuf + 40);
    poll_one(scq, &wc, "UD send");
    ok();

    begin("SRQ probe: post receives whose buffer is not registered, ibv_modify_srq(IBV_SRQ_LIMIT)");
    struct ibv_srq_init_attr sia = {0};
    sia.attr.max_wr = 3;
    sia.attr.max_sge = 1;
    struct ibv_srq *probe = ibv_create_srq(pd, &sia);
    if (!probe) fail("ibv_create_srq(max_wr 3): %s", strerror(errno));
    char byte;
    struct ibv_sge psge = {(uintptr_t)&byte, 1, 0};
    struct ibv_recv_wr pw2 = {.num_sge = 1, .sg_list = &psge}, pw1 = {.next = &pw2, .num_sge = 1, .sg_list = &psge};
    if ((rc = ibv_post_srq_recv(probe, &pw1, &bad_r)))
        fail("ibv_post_srq_recv with an unregistered buffer failed (%s); openib then disables the BTL", strerror(rc));
    struct ibv_srq_attr sa = {.max_wr = 2, .max_sge = 1, .srq_limit = 1};
    if ((rc = ibv_modify_srq(probe, &sa, IBV_SRQ_LIMIT)))
        fprintf(stderr, "note: ibv_modify_srq(IBV_SRQ_LIMIT) failed (%s): openib will not resize its SRQs\n", strerror(rc));
    if (ibv_destroy_srq(probe)) fail("ibv_destroy_srq: %s", strerror(errno));
    ok();

    begin("RC loopback QP on an SRQ: inline unsignaled send with immediate, RDMA WRITE, RDMA READ, fetch-add");
    struct ibv_cq *cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
    sia.attr.max_wr = 64;
    struct ibv_srq *srq = ibv_create_srq(pd, &sia);
    if (!cq || !srq) fail("ibv_create_cq/ibv_create_srq: %s", strerror(errno));
    memset(&qia, 0, sizeof(qia));
    qia.send_cq = cq;
    qia.recv_cq = cq;
    qia.srq = srq;
    qia.qp_type = IBV_QPT_RC;
    qia.cap.max_send_wr = 64;
    qia.cap.max_send_sge = 1;
    qia.cap.max_inline_data = 128;
    struct ibv_qp *rc_qp = ibv_create_qp(pd, &qia);
    if (!rc_qp) fail("ibv_create_qp(RC, SRQ, inline 128): %s", strerror(errno));
    if (qia.cap.max_inline_data < 128) fail("max_inline_data %u < 128", qia.cap.max_inline_data);
    to_rts_rc(rc_qp, pa.lid, rc_qp->qp_num);
    size_t big = 1 << 20;
    char *user = malloc(big), *dst = malloc(big), *rbuf = malloc(4096);
    int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    struct ibv_mr *mu = ibv_reg_mr(pd, user, big, acc), *md = ibv_reg_mr(pd, dst, big, acc),
                  *mr = ibv_reg_mr(pd, rbuf, 4096, acc);
    if (!mu || !md || !mr) fail("ibv_reg_mr of malloc'd buffers: %s", strerror(errno));
    struct ibv_sge s1 = {(uintptr_t)rbuf, 4096, mr->lkey};
    struct ibv_recv_wr r1 = {.wr_id = 10, .sg_list = &s1, .num_sge = 1};
    if (ibv_post_srq_recv(srq, &r1, &bad_r)) fail("ibv_post_srq_recv");
    char inl[128];
    memset(inl, 'i', sizeof(inl));
    struct ibv_sge s2 = {(uintptr_t)inl, sizeof(inl), 0};
    struct ibv_send_wr w = {0};
    w.wr_id = 11;
    w.sg_list = &s2;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND_WITH_IMM;
    w.imm_data = htonl(0x1234);
    w.send_flags = IBV_SEND_INLINE; /* unsignaled */
    if (ibv_post_send(rc_qp, &w, &bad_s)) fail("inline send: %s", strerror(errno));
    memset(inl, 'X', sizeof(inl)); /* reused at once, as openib does */
    poll_one(cq, &wc, "inline send with immediate (receive side)");
    if (wc.opcode != IBV_WC_RECV || !(wc.wc_flags & IBV_WC_WITH_IMM) || ntohl(wc.imm_data) != 0x1234 ||
        wc.byte_len != 128 || rbuf[0] != 'i' || rbuf[127] != 'i')
        fail("receive: opcode %d flags %#x imm %#x len %u data %c..%c", wc.opcode, wc.wc_flags, ntohl(wc.imm_data),
             wc.byte_len, rbuf[0], rbuf[127]);
    for (size_t i = 0; i < big; ++i) user[i] = (char)(i * 7);
    struct ibv_sge s3 = {(uintptr_t)user, (uint32_t)big, mu->lkey};
    memset(&w, 0, sizeof(w));
    w.wr_id = 12;
    w.sg_list = &s3;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = (uintptr_t)dst;
    w.wr.rdma.rkey = md->rkey;
    if (ibv_post_send(rc_qp, &w, &bad_s)) fail("RDMA WRITE: %s", strerror(errno));
    poll_one(cq, &wc, "RDMA WRITE 1 MiB");
    if (memcmp(user, dst, big)) fail("RDMA WRITE: data differs");
    memset(user, 0, big);
    w.opcode = IBV_WR_RDMA_READ;
    if (ibv_post_send(rc_qp, &w, &bad_s)) fail("RDMA READ: %s", strerror(errno));
    poll_one(cq, &wc, "RDMA READ 1 MiB");
    if (memcmp(user, dst, big)) fail("RDMA READ: data differs");
    uint64_t *counter = (uint64_t *)dst;
    *counter = 40;
    struct ibv_sge s4 = {(uintptr_t)user, 8, mu->lkey};
    w.sg_list = &s4;
    w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    w.wr.atomic.remote_addr = (uintptr_t)dst;
    w.wr.atomic.rkey = md->rkey;
    w.wr.atomic.compare_add = 2;
    if (ibv_post_send(rc_qp, &w, &bad_s)) fail("fetch-add: %s", strerror(errno));
    poll_one(cq, &wc, "atomic fetch-and-add");
    if (*(uint64_t *)user != 40 || *counter != 42) fail("fetch-add: fetched %lu, now %lu", (unsigned long)*(uint64_t *)user, (unsigned long)*counter);
    ok();

    begin("memory unmapped before ibv_dereg_mr, mapped again and registered again");
    size_t mlen = 4 << 20;
    char *m1 = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m1 == MAP_FAILED) fail("mmap");
    memset(m1, 1, mlen);
    struct ibv_mr *mm = ibv_reg_mr(pd, m1, mlen, acc);
    if (!mm) fail("ibv_reg_mr: %s", strerror(errno));
    munmap(m1, mlen);
    if ((rc = ibv_dereg_mr(mm))) fail("ibv_dereg_mr after munmap: %s", strerror(rc));
    char *m2 = mmap(m1, mlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m2 == MAP_FAILED) fail("mmap");
    memset(m2, 2, mlen);
    mm = ibv_reg_mr(pd, m2, mlen, acc);
    if (!mm) fail("ibv_reg_mr of the new mapping: %s", strerror(errno));
    struct ibv_sge s5 = {(uintptr_t)m2, (uint32_t)big, mm->lkey};
    memset(&w, 0, sizeof(w));
    w.sg_list = &s5;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = (uintptr_t)dst;
    w.wr.rdma.rkey = md->rkey;
    if (ibv_post_send(rc_qp, &w, &bad_s)) fail("RDMA WRITE: %s", strerror(errno));
    poll_one(cq, &wc, "RDMA WRITE from the new mapping");
    for (size_t i = 0; i < big; ++i)
        if (dst[i] != 2) fail("byte %zu is %d: the old pages were used", i, dst[i]);
    ibv_dereg_mr(mm);
    munmap(m2, mlen);
    ok();

    ibv_destroy_qp(rc_qp);
    ibv_destroy_srq(srq);
    ibv_destroy_cq(cq);
    ibv_dereg_mr(mu);
    ibv_dereg_mr(md);
    ibv_dereg_mr(mr);
    ibv_destroy_ah(ah);
    ibv_destroy_qp(ud);
    ibv_dereg_mr(umr);
    ibv_destroy_cq(rcq);
    ibv_destroy_cq(scq);
    if (ch) ibv_destroy_comp_channel(ch);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    if (!quiet) printf("vrdma-openib-check: %s can carry Open MPI's openib BTL\n", name);
    return 0;
}
