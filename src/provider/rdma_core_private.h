// The part of rdma-core's private provider interface (provider ABI "34",
// libibverbs' IBVERBS_PRIVATE_34) that libvrdma uses.
//
// rdma-core does not install its provider header, so these declarations are
// written here from the layouts of rdma-core's tagged sources (v44.0). They
// must match byte for byte; the static_asserts below pin what can be pinned.
// Public types (struct verbs_context, struct ibv_*) come from the installed
// <infiniband/verbs.h>.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <ctime>

extern "C" {

// ccan's doubly linked list node.
struct vrdma_list_node {
    vrdma_list_node* next;
    vrdma_list_node* prev;
};

enum {
    VRDMA_MATCH_SENTINEL = 0,
    VRDMA_MATCH_PCI = 1,
    VRDMA_MATCH_MODALIAS = 2,
    VRDMA_MATCH_DRIVER_ID = 3,
};

struct verbs_match_ent {
    void* driver_data;
    union {
        const char* modalias;
        uint64_t driver_id;
    } u;
    uint16_t vendor;
    uint16_t device;
    uint8_t kind;
};

// One RDMA device found in sysfs (filled by libibverbs).
struct verbs_sysfs_dev {
    vrdma_list_node entry;
    void* provider_data;
    const verbs_match_ent* match;
    unsigned int flags;
    char sysfs_name[IBV_SYSFS_NAME_MAX];
    dev_t sysfs_cdev;
    char ibdev_name[IBV_SYSFS_NAME_MAX];
    char ibdev_path[IBV_SYSFS_PATH_MAX];
    char modalias[512];
    uint64_t node_guid;
    uint32_t driver_id;
    enum ibv_node_type node_type;
    int ibdev_idx;
    uint32_t num_ports;
    uint32_t abi_ver;
    struct timespec time_created;
};

struct verbs_device;

struct verbs_device_ops {
    const char* name;
    uint32_t match_min_abi_version;
    uint32_t match_max_abi_version;
    const verbs_match_ent* match_table;
    const verbs_device_ops** static_providers;
    bool (*match_device)(verbs_sysfs_dev* sysfs_dev);
    verbs_context* (*alloc_context)(ibv_device* device, int cmd_fd, void* private_data);
    verbs_context* (*import_context)(ibv_device* device, int cmd_fd);
    verbs_device* (*alloc_device)(verbs_sysfs_dev* sysfs_dev);
    void (*uninit_device)(verbs_device* device);
};

struct verbs_device {
    ibv_device device;  // first
    const verbs_device_ops* ops;
    int refcount;       // C11 atomic_int in rdma-core: same size and alignment
    vrdma_list_node entry;
    verbs_sysfs_dev* sysfs;
    uint64_t core_support;
};

struct verbs_xrcd {
    ibv_xrcd xrcd;
    uint32_t comp_mask;
    uint32_t handle;
};

enum ibv_mr_type {
    IBV_MR_TYPE_MR,
    IBV_MR_TYPE_NULL_MR,
    IBV_MR_TYPE_IMPORTED_MR,
    IBV_MR_TYPE_DMABUF_MR,
};

struct verbs_mr {
    ibv_mr ibv_mr;
    enum ibv_mr_type mr_type;
    int access;
};

struct verbs_qp {
    union {
        ibv_qp qp;
        ibv_qp_ex qp_ex;
    };
    uint32_t comp_mask;
    verbs_xrcd* xrcd;
};
enum { VRDMA_VERBS_QP_XRCD = 1 << 0, VRDMA_VERBS_QP_EX = 1 << 1 };

struct verbs_cq {
    union {
        ibv_cq cq;
        ibv_cq_ex cq_ex;
    };
};

struct verbs_srq {
    ibv_srq srq;
    enum ibv_srq_type srq_type;
    verbs_xrcd* xrcd;
    ibv_cq* cq;
    uint32_t srq_num;
};

// Every op a provider can supply, in rdma-core's (alphabetical) order.
struct verbs_context_ops {
    int (*advise_mr)(ibv_pd*, enum ibv_advise_mr_advice, uint32_t, ibv_sge*, uint32_t);
    ibv_dm* (*alloc_dm)(ibv_context*, ibv_alloc_dm_attr*);
    ibv_mw* (*alloc_mw)(ibv_pd*, enum ibv_mw_type);
    ibv_mr* (*alloc_null_mr)(ibv_pd*);
    ibv_pd* (*alloc_parent_domain)(ibv_context*, ibv_parent_domain_init_attr*);
    ibv_pd* (*alloc_pd)(ibv_context*);
    ibv_td* (*alloc_td)(ibv_context*, ibv_td_init_attr*);
    void (*async_event)(ibv_context*, ibv_async_event*);
    int (*attach_counters_point_flow)(ibv_counters*, ibv_counter_attach_attr*, ibv_flow*);
    int (*attach_mcast)(ibv_qp*, const ibv_gid*, uint16_t);
    int (*bind_mw)(ibv_qp*, ibv_mw*, ibv_mw_bind*);
    int (*close_xrcd)(ibv_xrcd*);
    void (*cq_event)(ibv_cq*);
    ibv_ah* (*create_ah)(ibv_pd*, ibv_ah_attr*);
    ibv_counters* (*create_counters)(ibv_context*, ibv_counters_init_attr*);
    ibv_cq* (*create_cq)(ibv_context*, int, ibv_comp_channel*, int);
    ibv_cq_ex* (*create_cq_ex)(ibv_context*, ibv_cq_init_attr_ex*);
    ibv_flow* (*create_flow)(ibv_qp*, ibv_flow_attr*);
    ibv_flow_action* (*create_flow_action_esp)(ibv_context*, ibv_flow_action_esp_attr*);
    ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
    ibv_qp* (*create_qp_ex)(ibv_context*, ibv_qp_init_attr_ex*);
    ibv_rwq_ind_table* (*create_rwq_ind_table)(ibv_context*, ibv_rwq_ind_table_init_attr*);
    ibv_srq* (*create_srq)(ibv_pd*, ibv_srq_init_attr*);
    ibv_srq* (*create_srq_ex)(ibv_context*, ibv_srq_init_attr_ex*);
    ibv_wq* (*create_wq)(ibv_context*, ibv_wq_init_attr*);
    int (*dealloc_mw)(ibv_mw*);
    int (*dealloc_pd)(ibv_pd*);
    int (*dealloc_td)(ibv_td*);
    int (*dereg_mr)(verbs_mr*);
    int (*destroy_ah)(ibv_ah*);
    int (*destroy_counters)(ibv_counters*);
    int (*destroy_cq)(ibv_cq*);
    int (*destroy_flow)(ibv_flow*);
    int (*destroy_flow_action)(ibv_flow_action*);
    int (*destroy_qp)(ibv_qp*);
    int (*destroy_rwq_ind_table)(ibv_rwq_ind_table*);
    int (*destroy_srq)(ibv_srq*);
    int (*destroy_wq)(ibv_wq*);
    int (*detach_mcast)(ibv_qp*, const ibv_gid*, uint16_t);
    void (*free_context)(ibv_context*);
    int (*free_dm)(ibv_dm*);
    int (*get_srq_num)(ibv_srq*, uint32_t*);
    ibv_dm* (*import_dm)(ibv_context*, uint32_t);
    ibv_mr* (*import_mr)(ibv_pd*, uint32_t);
    ibv_pd* (*import_pd)(ibv_context*, uint32_t);
    int (*modify_cq)(ibv_cq*, ibv_modify_cq_attr*);
    int (*modify_flow_action_esp)(ibv_flow_action*, ibv_flow_action_esp_attr*);
    int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
    int (*modify_qp_rate_limit)(ibv_qp*, ibv_qp_rate_limit_attr*);
    int (*modify_srq)(ibv_srq*, ibv_srq_attr*, int);
    int (*modify_wq)(ibv_wq*, ibv_wq_attr*);
    ibv_qp* (*open_qp)(ibv_context*, ibv_qp_open_attr*);
    ibv_xrcd* (*open_xrcd)(ibv_context*, ibv_xrcd_init_attr*);
    int (*poll_cq)(ibv_cq*, int, ibv_wc*);
    int (*post_recv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**);
    int (*post_send)(ibv_qp*, ibv_send_wr*, ibv_send_wr**);
    int (*post_srq_ops)(ibv_srq*, ibv_ops_wr*, ibv_ops_wr**);
    int (*post_srq_recv)(ibv_srq*, ibv_recv_wr*, ibv_recv_wr**);
    int (*query_device_ex)(ibv_context*, const ibv_query_device_ex_input*, ibv_device_attr_ex*,
                           size_t);
    int (*query_ece)(ibv_qp*, ibv_ece*);
    int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);
    int (*query_qp)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*);
    int (*query_qp_data_in_order)(ibv_qp*, enum ibv_wr_opcode, uint32_t);
    int (*query_rt_values)(ibv_context*, ibv_values_ex*);
    int (*query_srq)(ibv_srq*, ibv_srq_attr*);
    int (*read_counters)(ibv_counters*, uint64_t*, uint32_t, uint32_t);
    ibv_mr* (*reg_dm_mr)(ibv_pd*, ibv_dm*, uint64_t, size_t, unsigned int);
    ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);
    ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, uint64_t, int);
    int (*req_notify_cq)(ibv_cq*, int);
    int (*rereg_mr)(verbs_mr*, int, ibv_pd*, void*, size_t, int);
    int (*resize_cq)(ibv_cq*, int);
    int (*set_ece)(ibv_qp*, ibv_ece*);
    void (*unimport_dm)(ibv_dm*);
    void (*unimport_mr)(ibv_mr*);
    void (*unimport_pd)(ibv_pd*);
};

void verbs_register_driver_34(const verbs_device_ops* ops);
void* _verbs_init_and_alloc_context(ibv_device* device, int cmd_fd, size_t alloc_size,
                                    verbs_context* context_offset, uint32_t driver_id);
void verbs_uninit_context(verbs_context* context);
ibv_context* verbs_open_device(ibv_device* device, void* private_data);
void verbs_set_ops(verbs_context* vctx, const verbs_context_ops* ops);
void verbs_init_cq(ibv_cq* cq, ibv_context* context, ibv_comp_channel* channel, void* cq_context);

}  // extern "C"

// Layout checks (x86-64 / LP64), computed from rdma-core v44.0's definitions.
static_assert(sizeof(verbs_match_ent) == 24);
static_assert(offsetof(verbs_sysfs_dev, sysfs_name) == 36);
static_assert(offsetof(verbs_sysfs_dev, sysfs_cdev) == 104);
static_assert(offsetof(verbs_sysfs_dev, ibdev_path) == 176);
static_assert(offsetof(verbs_sysfs_dev, modalias) == 432);
static_assert(offsetof(verbs_sysfs_dev, abi_ver) == 968);
static_assert(sizeof(verbs_sysfs_dev) == 992);
static_assert(sizeof(verbs_device_ops) == 72);
static_assert(offsetof(verbs_device, ops) == sizeof(ibv_device));
static_assert(sizeof(verbs_context_ops) == 76 * sizeof(void*));
static_assert(offsetof(verbs_context_ops, alloc_pd) == 5 * sizeof(void*));
static_assert(offsetof(verbs_context_ops, poll_cq) == 53 * sizeof(void*));
static_assert(offsetof(verbs_context_ops, reg_mr) == 68 * sizeof(void*));
static_assert(offsetof(verbs_context_ops, unimport_pd) == 75 * sizeof(void*));
static_assert(offsetof(verbs_mr, mr_type) == sizeof(ibv_mr));
static_assert(offsetof(verbs_qp, comp_mask) == sizeof(ibv_qp_ex));
static_assert(offsetof(verbs_context, context) + sizeof(ibv_context) == sizeof(verbs_context));
