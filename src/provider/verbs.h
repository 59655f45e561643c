// The verbs_context_ops implementations, grouped by file.
#pragma once

#include "rdma_core_private.h"

namespace vrdma::prov {

struct Dm;

// device_query.cpp
int query_device_ex(ibv_context*, const ibv_query_device_ex_input*, ibv_device_attr_ex*, size_t);
int query_port(ibv_context*, uint8_t, ibv_port_attr*);
int query_rt_values(ibv_context*, ibv_values_ex*);

// verbs_dm.cpp
ibv_dm* alloc_dm(ibv_context*, ibv_alloc_dm_attr*);
int free_dm(ibv_dm*);
ibv_mr* reg_dm_mr(ibv_pd*, ibv_dm*, uint64_t, size_t, unsigned int);
// An MR over device memory is made (ibv_reg_dm_mr) or goes (ibv_dereg_mr);
// the caller holds the context's mem_mu.
void dm_mr_made(Dm* dm);
void dm_mr_gone(Dm* dm);
constexpr uint64_t kMaxDmBytes = 1 << 20;  // ibv_device_attr_ex::max_dm_size, per context
ibv_dm* import_dm(ibv_context*, uint32_t);
void unimport_dm(ibv_dm*);

// import.cpp (ibv_import_device itself is a preloaded entry point there)
ibv_pd* import_pd(ibv_context*, uint32_t);
void unimport_pd(ibv_pd*);
ibv_mr* import_mr(ibv_pd*, uint32_t);
void unimport_mr(ibv_mr*);
// verbs_device_ops.import_context: reached only when libibverbs' own
// ibv_import_device runs, which cannot work for vrdma (import.cpp).
verbs_context* import_context(ibv_device*, int);
// alloc_context for an import: `private_data` of verbs_open_device when
// import.cpp opens the device for ibv_import_device (null otherwise).
struct ImportRequest;
verbs_context* alloc_imported_context(ibv_device* device, int cmd_fd, ImportRequest& req);
ImportRequest* as_import_request(void* private_data);

// verbs_parent_domain.cpp
ibv_pd* alloc_parent_domain(ibv_context*, ibv_parent_domain_init_attr*);
bool is_parent_domain(ibv_context*, ibv_pd*);

// verbs_pd_mr_ah.cpp
// A Pd struct for the shim's PD `handle` (a parent domain: over
// `protection`); null with errno ENOMEM.
struct Pd;
Pd* new_pd(ibv_context* ibctx, uint32_t handle, Pd* protection = nullptr);
ibv_pd* alloc_pd(ibv_context*);
int dealloc_pd(ibv_pd*);
ibv_mr* reg_mr(ibv_pd*, void*, size_t, uint64_t, int);
// The registration behind ibv_reg_mr and ibv_reg_dm_mr: [addr, addr+length)
// shared with the shim, named by `iova` in work requests (dm: the device
// memory it lies in, or null).
// With `on_demand`, nothing is shared now (on_demand.h).
ibv_mr* register_memory(ibv_pd* pd, uintptr_t addr, size_t length, uint64_t iova, int access, Dm* dm,
                        bool on_demand = false);
int dereg_mr(verbs_mr*);
int rereg_mr(verbs_mr*, int, ibv_pd*, void*, size_t, int);
ibv_ah* create_ah(ibv_pd*, ibv_ah_attr*);
int destroy_ah(ibv_ah*);

// verbs_xrc.cpp
ibv_xrcd* open_xrcd(ibv_context*, ibv_xrcd_init_attr*);
int close_xrcd(ibv_xrcd*);

// verbs_mw.cpp
ibv_mw* alloc_mw(ibv_pd*, ibv_mw_type);
int dealloc_mw(ibv_mw*);
int bind_mw(ibv_qp*, ibv_mw*, ibv_mw_bind*);

// verbs_cq.cpp
ibv_cq* create_cq(ibv_context*, int, ibv_comp_channel*, int);
int destroy_cq(ibv_cq*);
int poll_cq(ibv_cq*, int, ibv_wc*);
int req_notify_cq(ibv_cq*, int);
ibv_cq_ex* create_cq_ex(ibv_context*, ibv_cq_init_attr_ex*);
int resize_cq(ibv_cq*, int);
struct Cq;
// After an empty poll past the spin: yields the CPU; false if the shim is gone.
bool cq_idle(Cq& cq);
// Drops the completions of QP `qp_num` that wait in `cq` (receive
// completions too when `receives`), keeping the others in order: a QP
// moved to RESET leaves nothing behind, as on mlx5.
void discard_completions(Cq& cq, uint32_t qp_num, bool receives);

// cq_ex_poll.cpp: start_poll/next_poll/end_poll and the read_* functions
// over the same completion ring. The completion fields offered:
constexpr uint64_t kCqExWcFlags = uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                  IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK | IBV_WC_EX_WITH_TM_INFO;
// The device clock the stamps are read on (abi::Cqe::completion_ns): the
// host's CLOCK_MONOTONIC in ns, so hca_core_clock is 1 GHz.
constexpr uint64_t kCoreClockKhz = 1000000;
void install_cq_ex_ops(Cq& cq);

// verbs_qp.cpp
ibv_qp* create_qp(ibv_pd*, ibv_qp_init_attr*);
ibv_qp* create_qp_ex(ibv_context*, ibv_qp_init_attr_ex*);
int modify_qp(ibv_qp*, ibv_qp_attr*, int);
int query_qp(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*);
int destroy_qp(ibv_qp*);

// verbs_mcast.cpp
int attach_mcast(ibv_qp*, const ibv_gid*, uint16_t);
int detach_mcast(ibv_qp*, const ibv_gid*, uint16_t);

// verbs_srq.cpp
ibv_srq* create_srq(ibv_pd*, ibv_srq_init_attr*);
ibv_srq* create_srq_ex(ibv_context*, ibv_srq_init_attr_ex*);
int get_srq_num(ibv_srq*, uint32_t*);
int modify_srq(ibv_srq*, ibv_srq_attr*, int);
int query_srq(ibv_srq*, ibv_srq_attr*);
int destroy_srq(ibv_srq*);

// data_path.cpp
int post_send(ibv_qp*, ibv_send_wr*, ibv_send_wr**);
int post_recv(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**);
int post_srq_recv(ibv_srq*, ibv_recv_wr*, ibv_recv_wr**);
int post_srq_ops(ibv_srq*, ibv_ops_wr*, ibv_ops_wr**);

// qp_ex_send.cpp: the ibv_qp_ex work-request API
struct Qp;
void install_qp_ex_ops(Qp& qp, uint64_t send_ops_flags);

}  // namespace vrdma::prov
