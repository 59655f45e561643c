#include "qp_state.h"

#include <infiniband/verbs.h>

#include "async_events.h"

namespace vrdma::shim {
namespace {

constexpr uint32_t kStates = IBV_QPS_ERR + 1;

struct Rule {
    bool valid = false;
    uint32_t req_rc = 0, req_ud = 0, req_uc = 0;
    uint32_t opt_rc = 0, opt_ud = 0, opt_uc = 0;
};

struct Table {
    Rule r[kStates][kStates];
    constexpr Table() {
        for (uint32_t s = 0; s < kStates; ++s) {
            r[s][IBV_QPS_RESET].valid = true;
            r[s][IBV_QPS_ERR].valid = true;
        }
        Rule& ri = r[IBV_QPS_RESET][IBV_QPS_INIT];
        ri.valid = true;
        ri.req_rc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        ri.req_ud = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        ri.req_uc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;

        Rule& ii = r[IBV_QPS_INIT][IBV_QPS_INIT];
        ii.valid = true;
        ii.opt_rc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        ii.opt_ud = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        ii.opt_uc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;

        Rule& ir = r[IBV_QPS_INIT][IBV_QPS_RTR];
        ir.valid = true;
        ir.req_rc = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                    IBV_QP_MIN_RNR_TIMER;
        ir.opt_rc = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
        ir.opt_ud = IBV_QP_PKEY_INDEX | IBV_QP_QKEY;
        // UC: no acknowledgements, so no RNR timer and no RDMA reads.
        ir.req_uc = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        ir.opt_uc = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;

        Rule& rs = r[IBV_QPS_RTR][IBV_QPS_RTS];
        rs.valid = true;
        rs.req_rc = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
        rs.req_ud = IBV_QP_SQ_PSN;
        rs.opt_rc = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                    IBV_QP_PATH_MIG_STATE;
        rs.opt_ud = IBV_QP_CUR_STATE | IBV_QP_QKEY;
        rs.req_uc = IBV_QP_SQ_PSN;  // no timeout, retries or reads
        rs.opt_uc = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE;

        Rule& ss = r[IBV_QPS_RTS][IBV_QPS_RTS];
        ss.valid = true;
        ss.opt_rc = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                    IBV_QP_MIN_RNR_TIMER;
        ss.opt_ud = IBV_QP_CUR_STATE | IBV_QP_QKEY;
        ss.opt_uc = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;

        Rule& sd = r[IBV_QPS_RTS][IBV_QPS_SQD];
        sd.valid = true;
        sd.opt_rc = sd.opt_ud = sd.opt_uc = IBV_QP_EN_SQD_ASYNC_NOTIFY;

        Rule& ds = r[IBV_QPS_SQD][IBV_QPS_RTS];
        ds.valid = true;
        ds.opt_rc = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                    IBV_QP_PATH_MIG_STATE;
        ds.opt_ud = IBV_QP_CUR_STATE | IBV_QP_QKEY;
        ds.opt_uc = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE;

        Rule& dd = r[IBV_QPS_SQD][IBV_QPS_SQD];
        dd.valid = true;
        dd.opt_rc = IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                    IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH |
                    IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE;
        dd.opt_ud = IBV_QP_PKEY_INDEX | IBV_QP_QKEY;
        dd.opt_uc = IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE;

        // SQE exists for UD and UC (RC send errors go straight to ERR).
        Rule& es = r[IBV_QPS_SQE][IBV_QPS_RTS];
        es.valid = true;
        es.opt_ud = IBV_QP_CUR_STATE | IBV_QP_QKEY;
        es.opt_uc = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS;
    }
};
constexpr Table kTable;

// IBV_ACCESS_ON_DEMAND changes nothing for a QP; applications that use ODP
// pass their MRs' flags (rdma-core's suite does), and rxe and mlx5 take it.
constexpr uint32_t kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ON_DEMAND;

bool ah_ok(const abi::AhAttr& ah) {
    if (ah.dlid == 0 || ah.dlid >= 0xc000) return false;  // unicast LIDs only
    if (ah.sl > 15 || ah.port_num != 1) return false;
    if (ah.is_global > 1 || (ah.is_global && ah.sgid_index != 0)) return false;
    return true;
}

}  // namespace

bool qp_modify_is_ok(uint32_t cur, uint32_t next, uint32_t qp_type, uint32_t mask) {
    if (cur >= kStates || next >= kStates) return false;
    const bool xrc = qp_type == IBV_QPT_XRC_SEND || qp_type == IBV_QPT_XRC_RECV;
    if (qp_type != IBV_QPT_RC && qp_type != IBV_QPT_UD && qp_type != IBV_QPT_UC && !xrc) return false;
    const Rule& rule = kTable.r[cur][next];
    if (!rule.valid) return false;
    const bool reliable = qp_type == IBV_QPT_RC || xrc;
    if (cur == IBV_QPS_SQE && reliable && next == IBV_QPS_RTS) return false;
    mask &= ~uint32_t(IBV_QP_STATE);
    uint32_t req = reliable ? rule.req_rc : qp_type == IBV_QPT_UD ? rule.req_ud : rule.req_uc;
    uint32_t opt = reliable ? rule.opt_rc : qp_type == IBV_QPT_UD ? rule.opt_ud : rule.opt_uc;
    // XRC as the kernel's table has it: the sending side has no receive
    // queue (no RNR timer or RDMA-read depth to set at RTR), the receiving
    // side no send queue (only a timeout and the PSN at RTS).
    if (qp_type == IBV_QPT_XRC_SEND && cur == IBV_QPS_INIT && next == IBV_QPS_RTR) req = rule.req_uc;
    if (qp_type == IBV_QPT_XRC_RECV && cur == IBV_QPS_RTR && next == IBV_QPS_RTS)
        req = IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
    if ((mask & req) != req) return false;
    if (mask & ~(req | opt)) return false;
    return true;
}

int qp_check_attr_values(const abi::QpAttr& a, uint32_t mask, const Quotas& q) {
    if ((mask & IBV_QP_CUR_STATE) && a.cur_qp_state > IBV_QPS_ERR) return EINVAL;
    if ((mask & IBV_QP_ACCESS_FLAGS) && (a.qp_access_flags & ~kKnownAccess)) return EINVAL;
    if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index >= kMaxPkeys) return EINVAL;  // the guest's table: cmd_qp.cpp
    if ((mask & IBV_QP_PORT) && a.port_num != 1) return EINVAL;
    if ((mask & IBV_QP_AV) && !ah_ok(a.ah)) return EINVAL;
    if ((mask & IBV_QP_PATH_MTU) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096)) return EINVAL;
    if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return EINVAL;
    if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return EINVAL;
    if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return EINVAL;
    if ((mask & IBV_QP_RQ_PSN) && a.rq_psn > 0xffffff) return EINVAL;
    if ((mask & IBV_QP_SQ_PSN) && a.sq_psn > 0xffffff) return EINVAL;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > q.max_rd_atomic) return EINVAL;
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > q.max_rd_atomic) return EINVAL;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return EINVAL;
    if ((mask & IBV_QP_DEST_QPN) && (a.dest_qp_num > 0xffffff || a.dest_qp_num < 2)) return EINVAL;
    if ((mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && a.en_sqd_async_notify > 1) return EINVAL;
    return 0;
}

void qp_apply_attrs(Qp& qp, const abi::QpAttr& a, uint32_t mask) {
    abi::QpAttr& t = qp.attr;
    if (mask & IBV_QP_ACCESS_FLAGS) t.qp_access_flags = a.qp_access_flags;
    if (mask & IBV_QP_PKEY_INDEX) t.pkey_index = a.pkey_index;
    if (mask & IBV_QP_PORT) t.port_num = a.port_num;
    if (mask & IBV_QP_QKEY) t.qkey = a.qkey;
    if (mask & IBV_QP_AV) t.ah = a.ah;
    if (mask & IBV_QP_PATH_MTU) t.path_mtu = a.path_mtu;
    if (mask & IBV_QP_TIMEOUT) t.timeout = a.timeout;
    if (mask & IBV_QP_RETRY_CNT) t.retry_cnt = a.retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) t.rnr_retry = a.rnr_retry;
    if (mask & IBV_QP_RQ_PSN) t.rq_psn = a.rq_psn;
    if (mask & IBV_QP_SQ_PSN) t.sq_psn = a.sq_psn;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) t.max_rd_atomic = a.max_rd_atomic;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) t.max_dest_rd_atomic = a.max_dest_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER) t.min_rnr_timer = a.min_rnr_timer;
    if (mask & IBV_QP_DEST_QPN) t.dest_qp_num = a.dest_qp_num;
    if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) t.en_sqd_async_notify = a.en_sqd_async_notify;
}

void qp_set_error(Context& ctx, Qp& qp, int event) {
    if (qp.state == IBV_QPS_ERR || qp.state == IBV_QPS_RESET) return;
    qp.state = IBV_QPS_ERR;
    qp.req.wait = SqWait::None;
    qp.req.ack_deadline_ns = 0;
    qp.req.draining = false;
    ctx.request_rescan();
    if (event >= 0) post_qp_event(ctx, qp, uint32_t(event));
    qp_entered_error(ctx, qp);
}

void qp_set_sq_error(Context& ctx, Qp& qp) {
    if (qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_SQD) return;
    qp.state = IBV_QPS_SQE;
    qp.req.wait = SqWait::None;
    qp.req.ack_deadline_ns = 0;
    ctx.request_rescan();
}

uint64_t rnr_timer_ns(uint8_t code) {
    // Microseconds, IB spec table 45 (code 0 is the longest, 655.36 ms).
    static constexpr uint32_t kUs[32] = {655360, 10,    20,    30,    40,    60,     80,     120,
                                         160,    240,   320,   480,   640,   960,    1280,   1920,
                                         2560,   3840,  5120,  7680,  10240, 15360,  20480,  30720,
                                         40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
    return uint64_t(kUs[code & 31]) * 1000;
}

uint64_t ack_timeout_ns(uint8_t timeout) {
    if (timeout == 0) timeout = 14;
    if (timeout > 31) timeout = 31;
    return 4096ull << timeout;
}

}  // namespace vrdma::shim
