// The extended CQ poll interface (ibv_start_poll / ibv_next_poll /
// ibv_end_poll and the ibv_wc_read_* functions) over the same completion
// ring as ibv_poll_cq. The CQ's mutex is held from a successful start_poll
// to end_poll, so the current completion cannot move under the reader;
// the consumer index is published at end_poll.
#include <cerrno>

#include "objects.h"
#include "verbs.h"
#include "vrdma/ring.h"

namespace vrdma::prov {
namespace {

Cq* cq_of(ibv_cq_ex* c) { return reinterpret_cast<Cq*>(c); }
const abi::Cqe& cur(ibv_cq_ex* c) { return *cq_of(c)->cur; }

// Makes the completion at poll_cons current, if the shim has written it.
int load_current(Cq& cq) {
    if (!cq.cqe_ready(cq.poll_cons)) return ENOENT;
    cq.cur = &cq.cqes[ring_slot(cq.poll_cons, cq.entries)];
    ibv_cq_ex& ex = cq.vcq.cq_ex;
    ex.wr_id = cq.cur->wr_id;
    ex.status = static_cast<ibv_wc_status>(cq.cur->status);
    return 0;
}

int start_poll(ibv_cq_ex* ibcq, ibv_poll_cq_attr* attr) {
    Cq& cq = *cq_of(ibcq);
    if (attr->comp_mask) return EINVAL;
    cq.mu.lock();
    cq.poll_cons = cq.cons;
    int rc = load_current(cq);
    if (rc == 0) {
        cq.empty_polls = 0;
        return 0;  // locked until end_poll
    }
    cq.cur = nullptr;
    cq.mu.unlock();
    if (rc != ENOENT) return rc;
    if (cq.empty_polls < cq.ctx->poll_spin) {
        ++cq.empty_polls;
        return ENOENT;
    }
    return cq_idle(cq) ? ENOENT : EIO;
}

int next_poll(ibv_cq_ex* ibcq) {
    Cq& cq = *cq_of(ibcq);
    cq.poll_cons = ring_next(cq.poll_cons, cq.entries);
    int rc = load_current(cq);
    if (rc) cq.cur = nullptr;  // poll_cons is one past the last completion handed out
    return rc;
}

void end_poll(ibv_cq_ex* ibcq) {
    Cq& cq = *cq_of(ibcq);
    // Every completion start_poll/next_poll made current is consumed.
    uint32_t done = cq.cur ? ring_next(cq.poll_cons, cq.entries) : cq.poll_cons;
    cq.consume_to(done);
    cq.cur = nullptr;
    cq.mu.unlock();
}

ibv_wc_opcode read_opcode(ibv_cq_ex* c) { return static_cast<ibv_wc_opcode>(cur(c).opcode); }
uint32_t read_vendor_err(ibv_cq_ex* c) { return cur(c).vendor_err; }
uint32_t read_byte_len(ibv_cq_ex* c) { return cur(c).byte_len; }
// Also ibv_wc_read_invalidated_rkey (IBV_WC_WITH_INV): the same field.
__be32 read_imm_data(ibv_cq_ex* c) { return cur(c).imm_data; }
uint32_t read_qp_num(ibv_cq_ex* c) { return cur(c).qp_num; }
uint32_t read_src_qp(ibv_cq_ex* c) { return cur(c).src_qp; }
unsigned int read_wc_flags(ibv_cq_ex* c) { return cur(c).wc_flags; }
uint32_t read_slid(ibv_cq_ex* c) { return cur(c).slid; }
uint8_t read_sl(ibv_cq_ex* c) { return cur(c).sl; }
uint8_t read_dlid_path_bits(ibv_cq_ex* c) { return cur(c).dlid_path_bits; }
uint64_t read_completion_ts(ibv_cq_ex* c) { return cur(c).completion_ns; }
uint64_t read_completion_wallclock_ns(ibv_cq_ex* c) { return cur(c).wallclock_ns; }
void read_tm_info(ibv_cq_ex* c, ibv_wc_tm_info* info) {
    info->tag = cur(c).tm_tag;
    info->priv = cur(c).tm_priv;
}

}  // namespace

void install_cq_ex_ops(Cq& cq) {
    ibv_cq_ex& ex = cq.vcq.cq_ex;
    ex.start_poll = start_poll;
    ex.next_poll = next_poll;
    ex.end_poll = end_poll;
    ex.read_opcode = read_opcode;
    ex.read_vendor_err = read_vendor_err;
    ex.read_byte_len = read_byte_len;
    ex.read_imm_data = read_imm_data;
    ex.read_qp_num = read_qp_num;
    ex.read_src_qp = read_src_qp;
    ex.read_wc_flags = read_wc_flags;
    ex.read_slid = read_slid;
    ex.read_sl = read_sl;
    ex.read_dlid_path_bits = read_dlid_path_bits;
    ex.read_completion_ts = read_completion_ts;
    ex.read_completion_wallclock_ns = read_completion_wallclock_ns;
    ex.read_tm_info = read_tm_info;
}

}  // namespace vrdma::prov
