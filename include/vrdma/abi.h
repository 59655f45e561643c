// The vrdma device ABI: everything the provider (libvrdma) and the shim
// exchange, over the UNIX socket and through shared memory.
//
// Plain fixed-width structs only; every layout is pinned by static_asserts so
// that both sides (and future versions) agree byte for byte. Values that the
// guest writes are untrusted by the shim: it copies a record out of shared
// memory first and validates the copy (see docs/architecture.md, "Trust boundaries").
//
// Addresses in this ABI are guest virtual addresses ("gva"). The shim
// translates them through the segments the guest announced over the socket.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace vrdma::abi {

constexpr uint32_t kMagic = 0x76524d41;  // "vRMA"
constexpr uint32_t kVersion = 10;  // 2: work slots (ControlBlock::work_bits); 3: memory windows; 4: ReregMr keys;
                                  // 5: the doorbell no longer stands for queues with a work slot; 6: RegMr iova;
                                  // 7: XRC (OpenXrcd, XRC SRQs and QPs, SendWqe::xrc_remote_srqn);
                                  // 8: multicast (AttachMcast, DetachMcast, DeviceAttr's mcast limits);
                                  // 9: completion timestamps (CmdCreateCqReq::flags, Cqe::completion_ns);
                                  //    tag matching (TM SRQs, TmOp, Cqe::tm_tag, DeviceAttr::max_tm_tags)
                                  // 10: RingHeader::produced (a CQ's completions, free-running);
                                  //     kCqeOwner (a completion says itself that it is new)
constexpr uint32_t kPageSize = 4096;
constexpr uint32_t kCacheLine = 64;

// Name of the attribute file in class/infiniband/vrdma0/ that holds the
// absolute path of the guest's shim socket.
constexpr const char* kSocketAttr = "vrdma_socket";
// Present (content "1") in the tree of a device inside a VM, published by
// the VM's agent: the provider then takes its memory from the VM device's
// (docs/protocol.md "VM tenants").
constexpr const char* kVmAttr = "vrdma_vm";
constexpr const char* kDeviceName = "vrdma0";

// ---------------------------------------------------------------------------
// Socket protocol (SOCK_SEQPACKET; one struct per message; fds by SCM_RIGHTS)
//
// Every request gets exactly one SockReply. Requests are serialised by the
// provider (one outstanding at a time per connection).
// ---------------------------------------------------------------------------
enum class SockOp : uint32_t {
    Attach = 1,         // fds: [arena memfd, kick eventfd, cmd-done eventfd, async event write fd]
    AddSegment = 2,     // fds: [memfd]
    RemoveSegment = 3,  // no fds
    CreateChannel = 4,  // fds: [write end of the completion channel's pipe]
    DestroyChannel = 5, // no fds
    // Inside a VM (docs/protocol.md "VM tenants"), to the VM's agent only:
    // a region of the VM device's memory for the arena, before Attach. The
    // reply's `arg` is its offset in BAR2, in pages; fds: [BAR2, BAR0] (the
    // device's sysfs resource files, opened by the agent). Attach then
    // carries no fds: the arena is that region, mapped at arena_gva.
    VmOpen = 6,         // no fds; SockAttach's arena_len is the region's size
    // Inside a VM: a region of the device's memory to put a segment on
    // (SockAddSegment's len; the reply's `arg` is its offset in pages), and
    // one given back that never became a segment (SockAddSegment's offset).
    // A segment's region goes back with RemoveSegment.
    VmAlloc = 7,
    VmFree = 8,
};

struct SockHeader {
    uint32_t magic;
    uint32_t version;
    SockOp op;
    uint32_t reserved;
};
static_assert(sizeof(SockHeader) == 16);

// The arena is the first segment. The ControlBlock lives at its start.
struct SockAttach {
    SockHeader hdr;
    uint64_t arena_gva;   // page aligned
    uint64_t arena_len;   // page multiple, >= sizeof(ControlBlock)
};
static_assert(sizeof(SockAttach) == 32);

struct SockAddSegment {
    SockHeader hdr;
    uint64_t gva;       // page aligned
    uint64_t len;       // page multiple
    uint64_t offset;    // offset into the memfd that backs gva (page aligned)
    uint32_t seg_id;    // chosen by the provider, unique per connection, never 0
    uint32_t reserved;
};
static_assert(sizeof(SockAddSegment) == 48);

struct SockRemoveSegment {
    SockHeader hdr;
    uint32_t seg_id;
    uint32_t reserved;
};
static_assert(sizeof(SockRemoveSegment) == 24);

// A completion channel (protocol.md "Events"): the shim writes one 8-byte
// record (the CQ's user_handle) into the pipe per completion event of a CQ
// created with this channel_id.
struct SockChannel {
    SockHeader hdr;
    uint32_t channel_id;  // chosen by the provider, unique per connection, never 0
    uint32_t reserved;
};
static_assert(sizeof(SockChannel) == 24);

struct SockReply {
    uint32_t magic;
    int32_t status;     // 0 or a positive errno
    uint32_t guest_lid; // Attach only
    uint32_t arg;       // VmOpen: the region's offset in pages
    char message[112];  // NUL-terminated human-readable reason when status != 0
};
static_assert(sizeof(SockReply) == 128);

// ---------------------------------------------------------------------------
// Rings
// ---------------------------------------------------------------------------

// Header at the start of every ring's memory; slots follow at offset
// sizeof(RingHeader). The producer writes `producer`, the consumer writes
// `consumer` (see ring.h for the index encoding).
//
// `produced`, in a CQ's ring only: how many completions the shim added
// since the CQ was created, free-running (it wraps at 2^32, not with the
// indices) and kept across a resize; written before `producer`, which
// publishes it. The indices come round every twice the ring's entries, so
// they cannot tell none from that many; a process in a VM counts the
// completions since an arming by it (protocol.md "VM guests"). Nothing
// reads it back in the shim.
struct RingHeader {
    alignas(kCacheLine) std::atomic<uint32_t> producer;
    std::atomic<uint32_t> produced;
    uint32_t pad0[14];
    alignas(kCacheLine) std::atomic<uint32_t> consumer;
    uint32_t pad1[15];
};
static_assert(sizeof(RingHeader) == 128);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct Sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};
static_assert(sizeof(Sge) == 16);

// Send WQE header; followed in the same slot by num_sge Sge records, or, if
// send_flags has IBV_SEND_INLINE, by inline_len bytes of data.
// opcode and send_flags use libibverbs' enum ibv_wr_opcode / ibv_send_flags
// values.
//
// Memory windows (protocol.md "Memory windows"):
// - IBV_WR_BIND_MW: mw_handle names the window, rkey is its new rkey (only
//   the low 8 bits may differ from the current one), mr_lkey the MR it is
//   bound to (0 with length 0: a type 1 window is unbound), remote_addr and
//   compare_add the window's address and length, mw_access its access
//   (IBV_ACCESS_REMOTE_*). No SGEs.
// - IBV_WR_LOCAL_INV and IBV_WR_SEND_WITH_INV: rkey is the rkey to
//   invalidate.
struct SendWqe {
    uint64_t wr_id;
    uint32_t opcode;
    uint32_t send_flags;
    uint32_t imm_data;      // network byte order, as in ibv_send_wr
    uint32_t num_sge;
    uint32_t inline_len;
    uint32_t mw_handle;     // BIND_MW
    uint64_t remote_addr;   // RDMA and atomic operations; BIND_MW: the window's address
    uint32_t rkey;
    uint32_t mw_access;     // BIND_MW
    uint64_t compare_add;   // atomics; BIND_MW: the window's length
    uint64_t swap;
    uint32_t ah_handle;     // UD
    uint32_t remote_qpn;    // UD
    uint32_t remote_qkey;   // UD
    uint32_t mr_lkey;       // BIND_MW
    uint32_t xrc_remote_srqn;  // XRC_SEND: the SRQ the message is for
    uint32_t reserved4;
    uint64_t reserved3;
};
static_assert(sizeof(SendWqe) == 96);
static_assert(offsetof(SendWqe, remote_addr) == 32);

// Receive WQE header; followed by num_sge Sge records.
struct RecvWqe {
    uint64_t wr_id;
    uint32_t num_sge;
    uint32_t reserved;
};
static_assert(sizeof(RecvWqe) == 16);

// Completion entry, written by the shim. status/opcode/wc_flags use
// libibverbs' ibv_wc_status / ibv_wc_opcode / ibv_wc_flags values.
// Cqe::flags: the receive of a message sent with IBV_SEND_SOLICITED (ibv_wc
// has no such field: a VM's event thread reads it, vm_events.h).
constexpr uint16_t kCqeSolicited = 1;
// Cqe::flags: the owner bit (as mlx5's). The shim sets it in the first lap
// of the indices and clears it in the second (cqe_owner below), and
// writes the flags word last, with release: a poller sees that the
// completion at its consumer index is new, and whole, from that one line,
// without reading the producer index's. A new ring is all zeros, so none
// of its slots looks new.
constexpr uint16_t kCqeOwner = 2;
// The owner bit of a completion at index `idx` (ring.h) of a CQ of
// `entries` slots: set in the first lap of the indices, clear in the second.
constexpr uint16_t cqe_owner(uint32_t idx, uint32_t entries) { return (idx & entries) ? 0 : kCqeOwner; }
// The flags of a completion moved to index `idx` (a resize's copy, the
// removal of a QP's completions): its own, with the owner bit of its new place.
constexpr uint16_t cqe_flags_at(uint16_t flags, uint32_t idx, uint32_t entries) {
    return uint16_t((flags & ~kCqeOwner) | cqe_owner(idx, entries));
}

struct Cqe {
    uint64_t wr_id;
    uint32_t status;
    uint32_t opcode;
    uint32_t vendor_err;
    uint32_t byte_len;
    uint32_t imm_data;      // network byte order; with IBV_WC_WITH_INV the invalidated rkey (host order)
    uint32_t qp_num;
    uint32_t src_qp;
    uint32_t wc_flags;
    uint16_t pkey_index;
    uint16_t slid;
    uint8_t sl;
    uint8_t dlid_path_bits;
    uint16_t flags;         // kCqeSolicited
    union {
        // Written only in a CQ created with kCqTimestamps, when the shim
        // adds the completion: the device clock (the host's CLOCK_MONOTONIC
        // in ns; hca_core_clock is 1 GHz) and the host's CLOCK_REALTIME in ns.
        struct {
            uint64_t completion_ns;
            uint64_t wallclock_ns;
        };
        // A tag-matched receive (IBV_WC_TM_RECV with IBV_WC_TM_MATCH): the
        // message's tag and its TMH's app_ctx (ibv_wc_tm_info), host order.
        // A CQ has one or the other (a CQ asking for both is refused).
        struct {
            uint64_t tm_tag;
            uint32_t tm_priv;
            uint32_t tm_reserved;
        };
    };
};
static_assert(sizeof(Cqe) == 64);
// The flags word goes last (cq_push): the bytes before it, then those after.
static_assert(offsetof(Cqe, flags) == 46 && offsetof(Cqe, completion_ns) == 48);

// CQ memory: RingHeader, then CqNotify, then `entries` Cqe slots.
// The provider arms the CQ without a command: it writes arm_seq (incremented
// each ibv_req_notify_cq, a locked read-modify-write) and arm_solicited,
// then rings the doorbell; the shim raises one completion event per new
// arm_seq: for the first matching completion it adds after seeing it, or at
// once when a matching completion that it added while the CQ was not armed
// is still unpolled (as an HCA arms relative to the consumer index; a
// completion that already raised an event raises no second one).
struct CqNotify {
    alignas(kCacheLine) std::atomic<uint32_t> arm_seq;
    std::atomic<uint32_t> arm_solicited;  // 1: only solicited or error completions wake
    uint32_t pad[14];
};
static_assert(sizeof(CqNotify) == 64);

constexpr uint64_t cq_ring_bytes(uint32_t entries) {
    return sizeof(RingHeader) + sizeof(CqNotify) + uint64_t(entries) * sizeof(Cqe);
}
constexpr uint64_t cq_slots_offset() { return sizeof(RingHeader) + sizeof(CqNotify); }

// QP/SRQ work queue memory: RingHeader, then `entries` slots of `stride`
// bytes (a power of two, at least the header plus its SGEs/inline data).
constexpr uint64_t wq_ring_bytes(uint32_t entries, uint32_t stride) {
    return sizeof(RingHeader) + uint64_t(entries) * stride;
}
constexpr uint64_t wq_slots_offset() { return sizeof(RingHeader); }

constexpr uint32_t kMinWqeStride = 64;
constexpr uint32_t kMaxWqeStride = 16384;

// ---------------------------------------------------------------------------
// Control block: at offset 0 of the arena
// ---------------------------------------------------------------------------
constexpr uint32_t kCmdSlots = 16;

enum class CmdOp : uint32_t {
    QueryDevice = 1,
    QueryPort,
    AllocPd,
    DeallocPd,
    RegMr,
    DeregMr,
    CreateCq,
    DestroyCq,
    CreateQp,
    ModifyQp,
    QueryQp,
    DestroyQp,
    CreateSrq,
    ModifySrq,
    QuerySrq,
    DestroySrq,
    CreateAh,
    DestroyAh,
    ResizeCq,
    ReregMr,
    AllocMw,
    DeallocMw,
    OpenXrcd,
    CloseXrcd,
    AttachMcast,
    DetachMcast,
    TmOp,
    kMax
};

constexpr uint32_t kInvalidHandle = 0;  // handles are never 0

struct AhAttr {
    uint16_t dlid;
    uint8_t sl;
    uint8_t src_path_bits;
    uint8_t static_rate;
    uint8_t is_global;
    uint8_t port_num;
    uint8_t sgid_index;
    uint8_t dgid[16];
    uint32_t flow_label;
    uint8_t hop_limit;
    uint8_t traffic_class;
    uint16_t reserved;
};
static_assert(sizeof(AhAttr) == 32);

// Device attributes (the subset of ibv_device_attr the shim decides).
struct DeviceAttr {
    uint64_t node_guid;       // network byte order
    uint64_t sys_image_guid;  // network byte order
    uint64_t max_mr_size;
    uint64_t page_size_cap;
    uint32_t vendor_id;
    uint32_t vendor_part_id;
    uint32_t hw_ver;
    uint32_t max_qp;
    uint32_t max_qp_wr;
    uint32_t device_cap_flags;
    uint32_t max_sge;
    uint32_t max_sge_rd;
    uint32_t max_cq;
    uint32_t max_cqe;
    uint32_t max_mr;
    uint32_t max_pd;
    uint32_t max_qp_rd_atom;
    uint32_t max_qp_init_rd_atom;
    uint32_t max_res_rd_atom;
    uint32_t atomic_cap;      // enum ibv_atomic_cap
    uint32_t max_ah;
    uint32_t max_srq;
    uint32_t max_srq_wr;
    uint32_t max_srq_sge;
    uint32_t max_inline_data;
    uint32_t max_pkeys;
    uint32_t local_ca_ack_delay;
    uint32_t phys_port_cnt;
    uint32_t max_mw;
    uint32_t reserved;
    uint32_t max_mcast_grp;
    uint32_t max_mcast_qp_attach;
    uint32_t max_total_mcast_qp_attach;
    uint32_t max_tm_tags;     // tagged buffers per TM SRQ; 0: no tag matching (a shim with a device)
    char fw_ver[64];
};
static_assert(sizeof(DeviceAttr) == 32 + 30 * 4 + 64);

struct PortAttr {
    uint32_t state;           // enum ibv_port_state
    uint32_t max_mtu;         // enum ibv_mtu
    uint32_t active_mtu;
    uint32_t gid_tbl_len;
    uint32_t port_cap_flags;
    uint32_t max_msg_sz;
    uint32_t pkey_tbl_len;
    uint16_t lid;
    uint16_t sm_lid;
    uint8_t lmc;
    uint8_t max_vl_num;
    uint8_t sm_sl;
    uint8_t subnet_timeout;
    uint8_t active_width;
    uint8_t active_speed;
    uint8_t phys_state;
    uint8_t link_layer;       // IBV_LINK_LAYER_*
    uint8_t gid[16];          // GID index 0 (fe80::/64 + port GUID)
};
static_assert(sizeof(PortAttr) == 56);

// QP attributes as in ibv_qp_attr, fixed width. Used by ModifyQp (the fields
// named by attr_mask, enum ibv_qp_attr_mask) and returned by QueryQp.
struct QpAttr {
    uint32_t qp_state;
    uint32_t cur_qp_state;
    uint32_t path_mtu;
    uint32_t qkey;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint32_t dest_qp_num;
    uint32_t qp_access_flags;
    uint32_t max_send_wr;     // QueryQp: caps
    uint32_t max_recv_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
    uint16_t pkey_index;
    uint8_t port_num;
    uint8_t min_rnr_timer;
    uint8_t timeout;
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint8_t max_rd_atomic;
    uint8_t max_dest_rd_atomic;
    uint8_t sq_draining;
    uint8_t en_sqd_async_notify;
    uint8_t reserved;
    AhAttr ah;
};
static_assert(sizeof(QpAttr) == 52 + 12 + 32);

// Command payloads. Each request record fits CmdSlot::req, each response
// CmdSlot::resp.
struct CmdQueryPortReq { uint32_t port_num; };
struct CmdAllocPdResp { uint32_t pd_handle; };
struct CmdHandleReq { uint32_t handle; };  // DeallocPd, DeregMr, DeallocMw, DestroyCq/Qp/Srq/Ah, QueryQp, QuerySrq

struct CmdRegMrReq {
    uint32_t pd_handle;
    uint32_t access;          // enum ibv_access_flags
    uint64_t addr;            // gva; [addr, addr+length) is covered by announced segments
    uint64_t length;          // 0 only with IBV_ACCESS_ZERO_BASED (an MR over no device memory)
    uint64_t iova;            // what work requests name the MR's first byte by: addr, any
                              // other address (ibv_reg_mr_iova), or 0 (IBV_ACCESS_ZERO_BASED)
};
struct CmdRegMrResp { uint32_t mr_handle; uint32_t lkey; uint32_t rkey; };

// AllocMw: a window of type IBV_MW_TYPE_1 or IBV_MW_TYPE_2, unbound; its rkey
// names it from the start (bind WQEs change only its low 8 bits). DeallocMw
// takes a CmdHandleReq.
struct CmdAllocMwReq { uint32_t pd_handle; uint32_t type; };
struct CmdAllocMwResp { uint32_t mw_handle; uint32_t rkey; };

struct CmdCreateCqReq {
    uint64_t ring_gva;        // cq_ring_bytes(entries) bytes inside one segment
    uint64_t user_handle;     // echoed in events (the provider's ibv_cq*)
    uint32_t entries;         // power of two
    uint32_t channel_id;      // 0: no completion channel
    uint32_t comp_vector;
    uint32_t flags;           // kCqTimestamps; other bits: EINVAL
};
constexpr uint32_t kCqTimestamps = 1;  // stamp each completion (Cqe::completion_ns, wallclock_ns)
struct CmdCreateCqResp { uint32_t cq_handle; };

// ResizeCq: the provider holds the CQ (no polling) and supplies a new,
// zeroed ring; the shim moves the completions not yet consumed (per the
// old ring's consumer index) to slots 0..moved-1 of the new one, copies the
// arming state, and writes from there on. Refused (EINVAL) when more than
// `cqe` completions are outstanding.
struct CmdResizeCqReq {
    uint64_t ring_gva;        // cq_ring_bytes(entries) bytes inside one segment
    uint32_t cq_handle;
    uint32_t entries;         // power of two
    uint32_t cqe;             // what the application asked for (<= entries - 1)
    uint32_t reserved;
};
struct CmdResizeCqResp { uint32_t moved; };

// ReregMr: flags as ibv_rereg_mr_flags; pd_handle, access and addr/length
// are read only under CHANGE_PD, CHANGE_ACCESS and CHANGE_TRANSLATION. The
// MR keeps its handle and keys.
struct CmdReregMrReq {
    uint32_t mr_handle;
    uint32_t flags;
    uint32_t pd_handle;
    uint32_t access;
    uint64_t addr;
    uint64_t length;
};
// The MR's keys after the change: the same, except on a shim with a device,
// whose MR is registered anew (verbs lets ibv_rereg_mr change the keys).
struct CmdReregMrResp { uint32_t lkey; uint32_t rkey; };

// Response of DestroyCq, DestroyQp and DestroySrq: how many event records
// the shim wrote for the object over its life (completion events into its
// channel, async events into the context's async pipe). The provider
// compares them with the records it has read to know whether stale records
// naming the object may still sit in a pipe.
struct CmdDestroyResp { uint32_t comp_events; uint32_t async_events; };

struct CmdCreateQpReq {
    uint64_t sq_gva;          // wq_ring_bytes(sq_entries, sq_stride)
    uint64_t rq_gva;          // 0 when srq_handle != 0
    uint64_t user_handle;     // the provider's ibv_qp*
    uint32_t pd_handle;       // 0 for IBV_QPT_XRC_RECV
    uint32_t qp_type;         // IBV_QPT_RC, UC, UD, XRC_SEND or XRC_RECV
    uint32_t send_cq_handle;  // 0 for XRC_RECV
    uint32_t recv_cq_handle;
    uint32_t srq_handle;      // 0: own receive queue
    uint32_t sq_entries;      // power of two
    uint32_t sq_stride;       // power of two
    uint32_t rq_entries;
    uint32_t rq_stride;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
    uint32_t sq_sig_all;
    uint32_t xrcd_handle;     // XRC_RECV: its domain (it has no queues, CQs or PD)
};
// XRC_SEND: no receive queue (rq_*, recv_cq_handle and srq_handle 0).
// work_slot: the QP's bit in ControlBlock::work_bits, which the provider
// must set when the QP has new work (several QPs may share one beyond
// kWorkSlots QPs; kNoWorkSlot: none, the provider rings the doorbell counter
// instead; the shim gives every QP a slot).
struct CmdCreateQpResp { uint32_t qp_handle; uint32_t qpn; uint32_t work_slot; uint32_t reserved; };

struct CmdModifyQpReq { uint32_t qp_handle; uint32_t attr_mask; QpAttr attr; };
struct CmdQueryQpResp { QpAttr attr; };

struct CmdCreateSrqReq {
    uint64_t ring_gva;
    uint64_t user_handle;     // the provider's ibv_srq*
    uint32_t pd_handle;
    uint32_t entries;         // power of two
    uint32_t stride;          // power of two
    uint32_t max_sge;
    uint32_t srq_limit;
    uint32_t srq_type;        // IBV_SRQT_BASIC, IBV_SRQT_XRC or IBV_SRQT_TM
    uint32_t xrcd_handle;     // XRC: its domain
    uint32_t cq_handle;       // XRC, TM: where its receive (and TM list) completions go
    uint32_t max_num_tags;    // TM: the size of its tag list (<= DeviceAttr::max_tm_tags)
};
struct CmdCreateSrqResp { uint32_t srq_handle; uint32_t srqn; };

// Tag matching (docs/protocol.md "Tag matching"): one operation on a TM
// SRQ's tag list (ibv_post_srq_ops posts each of its list as one command).
constexpr uint32_t kMaxTmSge = 4;           // SGEs of a tagged buffer
constexpr uint32_t kMaxRndvHeaderBytes = 64; // a rendezvous request: TMH, RVH, user data
constexpr uint32_t kTmHeaderBytes = 16;     // struct ibv_tmh
constexpr uint32_t kMaxTmOps = 64;          // ibv_tm_caps::max_ops (each op is a command, done when it returns)
struct CmdTmOpReq {
    uint64_t wr_id;           // the operation's completion (IBV_OPS_SIGNALED)
    uint64_t recv_wr_id;      // ADD: the tagged buffer's receive completions
    uint64_t tag;             // ADD
    uint64_t mask;            // ADD
    uint32_t srq_handle;
    uint32_t opcode;          // IBV_WR_TAG_ADD, _DEL or _SYNC
    uint32_t flags;           // IBV_OPS_SIGNALED, IBV_OPS_TM_SYNC
    uint32_t unexpected_cnt;  // the unexpected messages software has handled
    uint32_t handle;          // DEL: the entry ADD returned
    uint32_t num_sge;         // ADD: <= kMaxTmSge
    Sge sge[kMaxTmSge];
};
struct CmdTmOpResp { uint32_t handle; };  // ADD: the entry

struct CmdModifySrqReq { uint32_t srq_handle; uint32_t attr_mask; uint32_t max_wr; uint32_t srq_limit; };
struct CmdQuerySrqResp { uint32_t max_wr; uint32_t max_sge; uint32_t srq_limit; };

// An XRC domain: the context's own (an XRC_RECV QP and the XRC SRQs it
// delivers to must share one).
struct CmdOpenXrcdResp { uint32_t xrcd_handle; };

// AttachMcast, DetachMcast: a UD QP joins or leaves the group `gid` (a
// multicast GID). `lid` is the caller's MLID, taken as a hint only: the
// shim derives a group's MLID from its MGID.
struct CmdMcastReq { uint32_t qp_handle; uint16_t lid; uint16_t reserved; uint8_t gid[16]; };

struct CmdCreateAhReq { uint32_t pd_handle; uint32_t reserved; AhAttr attr; };
struct CmdCreateAhResp { uint32_t ah_handle; };

constexpr size_t kCmdReqBytes = 176;
constexpr size_t kCmdRespBytes = 224;

// One command slot. The provider fills op/req, then stores seq (release),
// then advances ControlBlock::cmd_producer and rings the doorbell. The shim
// copies op/req out, executes, writes status/resp, then stores done_seq = seq
// (release) and signals the cmd-done eventfd.
struct CmdSlot {
    std::atomic<uint32_t> seq;
    std::atomic<uint32_t> done_seq;
    CmdOp op;
    int32_t status;           // shim: 0 or a positive errno
    alignas(8) uint8_t req[kCmdReqBytes];
    alignas(8) uint8_t resp[kCmdRespBytes];
};
static_assert(sizeof(CmdSlot) == 16 + kCmdReqBytes + kCmdRespBytes);
static_assert(sizeof(CmdModifyQpReq) <= kCmdReqBytes);
static_assert(sizeof(CmdCreateQpReq) <= kCmdReqBytes);
static_assert(sizeof(DeviceAttr) <= kCmdRespBytes);
static_assert(sizeof(CmdQueryQpResp) <= kCmdRespBytes);

// Any state but kShimRunning means the device is gone for good; the value
// says why: the shim stopped or failed, or the operator removed the guest
// (vrdmactl guest remove). The shim writes it once, the first reason wins.
enum ShimState : uint32_t { kShimRunning = 0, kShimFatal = 1, kGuestRemoved = 2 };

// Which QPs have new work, so that the shim finds them without looking at
// every queue: after moving a QP's producer index the provider sets bit
// (slot % 64) of work_bits[slot / 64], then bit (slot / 64) of
// work_summary (both seq_cst); the shim takes the summary and then each
// word it names with exchange(0). Bits are hints the shim validates like
// any guest input (a bit for no QP is ignored).
constexpr uint32_t kWorkWords = 64;
constexpr uint32_t kWorkSlots = kWorkWords * 64;
constexpr uint32_t kNoWorkSlot = 0xffffffffu;

struct ControlBlock {
    // Written by the provider after a command was posted, a CQ was armed or
    // a queue without a work slot moved (an SRQ): a plain counter the shim
    // only compares with its last view. It then runs the commands, and looks
    // at every queue of the context only if the context has such queues: a
    // QP with a work slot is found by its bit alone.
    alignas(kCacheLine) std::atomic<uint32_t> doorbell;
    uint32_t pad0[15];
    // Written by the shim: nonzero while it sleeps; the provider then writes
    // the kick eventfd after ringing the doorbell.
    alignas(kCacheLine) std::atomic<uint32_t> shim_sleeping;
    std::atomic<uint32_t> shim_state;
    uint32_t pad1[14];
    alignas(kCacheLine) std::atomic<uint32_t> cmd_producer;  // provider; ring index over kCmdSlots
    uint32_t pad2[15];
    alignas(kCacheLine) std::atomic<uint32_t> cmd_consumer;  // shim
    uint32_t pad3[15];
    alignas(kCacheLine) std::atomic<uint64_t> work_summary;  // provider sets bits, shim takes them
    uint64_t pad4[7];
    alignas(kCacheLine) std::atomic<uint64_t> work_bits[kWorkWords];
    alignas(kCacheLine) CmdSlot cmd[kCmdSlots];
};
static_assert(sizeof(ControlBlock) <= 2 * kPageSize);
constexpr uint64_t kControlBlockBytes = 2 * kPageSize;

// Inside a VM (docs/protocol.md "VM tenants") the shim cannot write the
// process's async event pipe: it puts each record (the pipe's format) into
// this ring, in the control block's last bytes, and the process's event
// thread moves them into the pipe (src/provider/vm_events.h). A full ring
// drops the record, as a full pipe does.
struct AsyncRecord {
    uint64_t element;
    uint32_t event_type;
    uint32_t reserved;
};
constexpr uint32_t kVmAsyncSlots = 32;
struct VmAsyncRing {
    alignas(kCacheLine) std::atomic<uint32_t> producer;  // the shim's; ring index over kVmAsyncSlots
    uint32_t pad0[15];
    alignas(kCacheLine) std::atomic<uint32_t> consumer;  // the process's
    uint32_t pad1[15];
    AsyncRecord slots[kVmAsyncSlots];
};
constexpr uint64_t kVmAsyncRingOffset = kControlBlockBytes - sizeof(VmAsyncRing);
static_assert(sizeof(ControlBlock) <= kVmAsyncRingOffset && kVmAsyncRingOffset % kCacheLine == 0);

// Limits of the ABI itself (the shim may enforce lower quotas).
constexpr uint32_t kMaxQueueEntries = 1u << 16;
constexpr uint32_t kMaxCqEntries = 1u << 20;
constexpr uint32_t kMaxSge = 32;
constexpr uint32_t kMaxInline = 1024;
constexpr uint32_t kUdGrhBytes = 40;
constexpr uint32_t kCompVectors = 1;    // ibv_context::num_comp_vectors; a CQ's comp_vector is below it

// ---------------------------------------------------------------------------
// The rdma_cm socket, RUN_DIR/NAME/rdma_cm.sock (docs/protocol.md "rdma_cm").
//
// The provider emulates the kernel's UCMA character device,
// /dev/infiniband/rdma_cm, for librdmacm: each open() of it is one
// connection to this socket (SOCK_SEQPACKET), served by the shim's
// connection manager. The fd librdmacm holds is the read end of a pipe
// into which the shim writes one byte per event it queues: poll says
// readable exactly while events wait, and end of file once the shim is
// gone (the provider then reports RDMA_CM_EVENT_DEVICE_REMOVAL). A command librdmacm write()s is sent as it is (the
// kernel's rdma_ucm_cmd_hdr and body, include/rdma/rdma_user_cm.h); the
// reply carries the bytes the kernel would have written to the command's
// response pointer, which the provider copies there. One request at a time
// per connection, each answered by one CmSockReply.
// ---------------------------------------------------------------------------
constexpr const char* kCmSocketName = "rdma_cm.sock";  // beside the guest's vrdma.sock
constexpr const char* kVmSocketName = "ivshmem.sock";  // a VM guest's: its QEMU connects (vm_abi.h)
constexpr uint32_t kCmMaxCommand = 512;   // a UCMA command, with SET_OPTION's value after it
constexpr uint32_t kCmMaxResponse = 512;  // the largest response the shim writes

enum class CmSockOp : uint32_t {
    Open = 1,     // first message; fds: [write end, read end] of the channel's pipe
    Command = 2,  // a UCMA command; MIGRATE_ID's fd is the target channel's channel_id
};

struct CmSockRequest {
    uint32_t magic;
    uint32_t version;
    CmSockOp op;
    uint32_t len;  // bytes that follow (Command: the command, then SET_OPTION's optlen bytes)
};
static_assert(sizeof(CmSockRequest) == 16);

struct CmSockReply {
    uint32_t magic;
    int32_t status;      // 0 or a positive errno; GET_EVENT: EAGAIN when no event is queued
    uint32_t len;        // response bytes that follow
    uint32_t channel_id; // Open: the channel's id (for MIGRATE_ID)
};
static_assert(sizeof(CmSockReply) == 16);

}  // namespace vrdma::abi
