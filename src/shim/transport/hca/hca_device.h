// The host's RDMA device (vrdma-shim --hca DEV[:PORT]), opened with the
// host's libibverbs, and the device objects that mirror a guest's
// (docs/protocol.md "The HCA transport").
//
// On a shim with a device, every guest PD has a device PD, every guest MR
// is registered on the device from the shim's mapping of the guest's
// memory with the guest's own addresses (ibv_reg_mr_iova), and every guest
// QP has a device QP. The guest sees the device's numbers: its lkey/rkey
// is the device MR's key and its QPN the device QP's, so a WQE posted by
// the guest is valid on the wire as it is, and a peer shim's device reaches
// the guest's memory with the keys the guest hands out. Device PDs keep
// guests apart at the device: another guest's key names an MR of another
// device PD and the device refuses it.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "poll_group.h"
#include "resources.h"
#include "vrdma/abi.h"

namespace vrdma::shim {

class Engine;
class HcaDevice;
struct SendWork;
struct RecvWork;

struct DevicePd final : KeptObject {
    ibv_pd* pd = nullptr;
    // A one-byte MR of the shim's, made at the first unbind of a type 1
    // window: a provider may read the MR of an unbind (rxe's does), which
    // names none.
    ibv_mr* unbind_mr = nullptr;
    uint8_t unbind_byte = 0;
    ~DevicePd() override;
};

struct DeviceMr final : KeptObject {
    ibv_mr* mr = nullptr;
    std::shared_ptr<DevicePd> pd;  // deallocated after its last MR and QP
    ~DeviceMr() override;
};
// The guest's lkey and rkey: the device's lkey (a device gives an MR with
// remote access the same rkey; one without has no rkey to use).
inline uint32_t device_mr_key(const DeviceMr& m) { return m.mr->lkey; }

// The device memory window of a guest window (created with it on a shim
// with a device): its rkey is the guest's, the guest's binds and
// invalidations on QPs bound to the device are posted as they are, and a
// remote request through it is checked by the device.
struct DeviceMw final : KeptObject {
    ibv_mw* mw = nullptr;
    std::shared_ptr<DevicePd> pd;
    // Bound on the device (a bind posted, no invalidation since): only
    // then is a local invalidation posted to the device.
    bool bound = false;
    ~DeviceMw() override;
};

// The device address handle of a guest AH (UD through the device): the
// path to the device GID of the shim that serves the AH's LID, made at the
// first datagram and again when that GID changes (hca_ud.h).
struct DeviceAh final : KeptObject {
    ibv_ah* ah = nullptr;
    std::shared_ptr<DevicePd> pd;
    uint8_t gid[16] = {};  // where it goes
    ~DeviceAh() override;
};

// UD: where the device puts the 40 bytes before each datagram's payload
// (its network header), one slot per receive WQE. The device's scatter
// list for a guest's UD receive is this slot, then the guest's list less
// its first 40 bytes: the shim reads the sender's address from its own
// memory, whatever the guest does with its buffers (perftest posts every
// receive on one buffer), and writes the guest's GRH there itself.
struct HeaderSlots {
    static constexpr uint32_t kBytes = 40;
    std::unique_ptr<uint8_t[]> bytes;
    uint32_t count = 0;
    ibv_mr* mr = nullptr;
    ~HeaderSlots();
    uint8_t* at(uint32_t i) const { return bytes.get() + uint64_t(i % count) * kBytes; }
};

// A UD receive's scatter list on the device: `header` (a header slot),
// then the guest's list `in` less its first 40 bytes. `out` has room for
// n + 1; returns how many it holds.
int ud_receive_sges(const ibv_sge& header, const abi::Sge* in, uint32_t n, ibv_sge* out);

// The device SRQ of a guest SRQ (created with it). Once a QP on the SRQ
// is bound (Srq::feeds_device), the shim moves the guest's receive WQEs from the
// guest's ring into the device SRQ, keeping each one's wr_id in a shadow
// slot named by the device work request id, and gives the guest its ring
// slot back at once: the device completes SRQ WQEs in any order. From
// then on only bound QPs may use the SRQ (hca_bind.cpp). Its work request
// ids name it (`id`, HcaDevice's table), so a completion gives its slot
// back whatever became of the QP that took the WQE.
struct DeviceSrq final : KeptObject {
    ibv_srq* srq = nullptr;
    HcaDevice* owner = nullptr;
    uint32_t id = 0;
    bool broken = false;  // the guest posted a WQE the device cannot take: no more are forwarded
    // Fed to the device: whether its QPs are UD (their receives get header
    // slots); the first QP bound decides, and QPs of the other kind cannot
    // be bound on it (hca_bind.cpp).
    bool ud = false;
    std::unique_ptr<HeaderSlots> headers;
    std::shared_ptr<DevicePd> pd;
    std::vector<uint64_t> wr_ids;    // by shadow slot: the guest's wr_id
    // By shadow slot: the WQE's scatter list (max_sge each), for the GRH a
    // UD receive gets in its first 40 bytes (hca_ud.h).
    uint32_t max_sge = 0;
    std::vector<abi::Sge> sges;
    std::vector<uint8_t> nsge;
    std::vector<uint8_t> on_device;  // by shadow slot
    std::vector<uint32_t> free;      // shadow slots not on the device
    ~DeviceSrq() override;
    uint32_t outstanding() const { return uint32_t(wr_ids.size() - free.size()); }
    // A completion gives its slot back; false if the slot was not on the
    // device (a completion the device cannot have made).
    bool take_back(uint32_t slot) {
        if (slot >= on_device.size() || !on_device[slot]) return false;
        on_device[slot] = 0;
        free.push_back(slot);
        return true;
    }
};

// The device QP of a guest QP. `gen` tells its completions from those of
// an earlier life (a RESET, or a QP destroyed whose completions are still
// in the shared CQ): it is in every work request id. Whether the QP is
// bound is the guest QP's `carried`.
struct DeviceQp final : KeptObject {
    ibv_qp* qp = nullptr;
    HcaDevice* owner = nullptr;
    std::shared_ptr<DevicePd> pd;
    std::shared_ptr<DeviceSrq> srq;  // destroyed after the QP (a guest context's SRQs go first)
    static constexpr uint32_t kGenMask = 0x3fffffff;  // 30 bits: what a work request id has room for
    uint32_t gen = 0;
    uint32_t rq_posted = 0;  // guest receive queue index forwarded up to
    uint32_t route_gen = 0;  // not bound: the route table generation last looked at
    uint32_t cq_slot = 0;    // which shared CQ, and how many entries it holds for this QP
    uint32_t cq_entries = 0;
    uint32_t qkey = 0;       // UD: the Q_Key the device QP has
    std::unique_ptr<HeaderSlots> headers;  // UD without an SRQ: by guest ring slot
    ~DeviceQp() override;
    // ERR: the device flushes what was posted (the guest QP's flush answers
    // for it: hca_completions.h). RESET: a new life.
    int to_error();
    int to_reset();
};

// The vendor id Soft-RoCE (rdma_rxe) reports (and vrdma itself).
constexpr uint32_t kRxeVendorId = 0xffffff;

// The device object a guest object keeps (resources.h, KeptObject): the
// HCA transport is its shim's one object keeper, so what a guest object
// keeps is the device's.
inline DevicePd* dev_of(const Pd& o) { return static_cast<DevicePd*>(o.kept.get()); }
inline DeviceMr* dev_of(const Mr& o) { return static_cast<DeviceMr*>(o.kept.get()); }
inline DeviceMw* dev_of(const Mw& o) { return static_cast<DeviceMw*>(o.kept.get()); }
inline DeviceSrq* dev_of(const Srq& o) { return static_cast<DeviceSrq*>(o.kept.get()); }
inline DeviceQp* dev_of(const Qp& o) { return static_cast<DeviceQp*>(o.kept.get()); }
inline DeviceAh* dev_of(const Ah& o) { return static_cast<DeviceAh*>(o.kept.get()); }
// The same, shared: a device object that outlives the guest's (a device
// QP holds its PD and SRQ).
inline std::shared_ptr<DevicePd> shared_dev_of(const Pd& o) { return std::static_pointer_cast<DevicePd>(o.kept); }
inline std::shared_ptr<DeviceSrq> shared_dev_of(const Srq& o) { return std::static_pointer_cast<DeviceSrq>(o.kept); }

class HcaDevice final : public PollGroup {
public:
    ~HcaDevice();

    // Opens "DEV" or "DEV:PORT" (names as ibv_devices prints them): the
    // port must be active; its GID for the fabric is the IPv4-mapped RoCE
    // GID if there is one, else the first non-zero GID. Null and `error`
    // on failure.
    static std::unique_ptr<HcaDevice> open(const std::string& spec, std::string& error);

    // Empty, or why guests' registrations may fail for want of lockable
    // memory: the device pins every guest MR in this process, which needs
    // CAP_IPC_LOCK or an RLIMIT_MEMLOCK as large as all of them together.
    static std::string memlock_advice();

    const std::string& name() const { return name_; }
    uint8_t port() const { return port_; }
    const uint8_t* gid() const { return gid_.raw; }
    int gid_index() const { return gid_index_; }
    ibv_mtu active_mtu() const { return active_mtu_; }
    // The largest datagram the device carries (UD through the device).
    uint32_t mtu_bytes() const { return 128u << active_mtu_; }
    std::string describe() const;

    // `count` header slots registered in `pd` (UD receives); null and
    // `err` on failure.
    std::unique_ptr<HeaderSlots> make_header_slots(const std::shared_ptr<DevicePd>& pd, uint32_t count, int& err);

    // Device objects of guest objects; null and a positive errno on failure.
    std::shared_ptr<DevicePd> alloc_pd(int& err);
    std::unique_ptr<DeviceMr> reg_mr(const std::shared_ptr<DevicePd>& pd, void* host, uint64_t len, uint64_t iova,
                                     uint32_t access, int& err);
    std::shared_ptr<DeviceSrq> create_srq(const std::shared_ptr<DevicePd>& pd, uint32_t max_wr, uint32_t max_sge,
                                          int& err);
    // With `srq`, recv_wr is the SRQ's size (for the CQ's room).
    std::unique_ptr<DeviceQp> create_qp(const std::shared_ptr<DevicePd>& pd, uint32_t type, uint32_t send_wr,
                                        uint32_t recv_wr, uint32_t send_sge, uint32_t recv_sge,
                                        uint32_t max_inline, const std::shared_ptr<DeviceSrq>& srq, int& err);
    void release_cq_room(const DeviceQp& q);
    // A path to `gid` (another shim's device, or this one's for its own
    // guests) on the device PD of a guest AH: its SL, and its traffic class
    // and hop limit if the guest's AH is global.
    // Whether the device may hold windows of `type`. Soft-RoCE on Linux 6.1
    // dereferences a null QP when a Send with Invalidate names a type 2
    // window that is not bound (rxe_invalidate_mw): a peer could crash the
    // host's kernel, so on rxe type 2 windows stay the shim's.
    bool takes_windows(uint32_t type) const { return type == IBV_MW_TYPE_1 || attr_.vendor_id != kRxeVendorId; }
    std::unique_ptr<DeviceMw> alloc_mw(const std::shared_ptr<DevicePd>& pd, uint32_t type, int& err);
    std::unique_ptr<DeviceAh> create_ah(const std::shared_ptr<DevicePd>& pd, const uint8_t* gid,
                                        const abi::AhAttr& guest, int& err);

    // The device QP follows its guest QP to INIT, RTR and RTS with the
    // guest's attributes; the path (RC, UC) is the peer shim's device GID.
    int to_rtr(DeviceQp& q, const abi::QpAttr& a, const uint8_t* peer_gid);
    int to_rts(DeviceQp& q, const abi::QpAttr& a);
    // UD: the guest changed its Q_Key (RTS to RTS, SQD to SQD...).
    int set_qkey(DeviceQp& q, uint32_t qkey);

    // What a send WQE names that only the shim can translate: UD, the
    // device AH and the resolved Q_Key; BIND_MW, the device window and MR.
    struct SendTargets {
        ibv_ah* ah = nullptr;
        uint32_t qkey = 0;
        ibv_mw* mw = nullptr;
        ibv_mr* mr = nullptr;  // null: unbind (a type 1 window)
    };
    // Posts the guest's send WQE (already validated by the requester) as
    // ring index `idx`, and the guest's receive WQE `idx`. 0 or an errno.
    int post_send(DeviceQp& q, const SendWork& w, uint32_t idx, const SendTargets& t);
    int post_recv(DeviceQp& q, const RecvWork& w, uint32_t idx);
    // Posts the guest's SRQ receive WQE into a free shadow slot. 0 or an
    // errno (ENOSPC: the device SRQ is full).
    int post_srq_recv(DeviceSrq& s, const RecvWork& w);

    // Moves device completions into the guest CQs. True if any.
    bool poll(Engine& eng) override;
    // Before sleeping: asks for a completion event; the fd (comp_fd) is
    // then readable when one arrives. After waking: consume_events.
    void arm() override;
    // As a poll group (poll_group.h): the completion channel (its events
    // consumed; the next pass polls the CQs) and the async events.
    std::vector<int> fds() const override { return {comp_fd(), async_fd()}; }
    void on_event(Engine& eng, size_t i) override {
        if (i == 0) consume_events();
        else handle_async(eng);
    }
    int comp_fd() const { return channel_ ? channel_->fd : -1; }
    void consume_events();
    int async_fd() const { return ctx_ ? ctx_->async_fd : -1; }
    // Reads the device's async events (non-blocking): QP errors go to the
    // guest QPs, port changes to every guest (hca_events.h).
    void handle_async(Engine& eng);

    // What went through the device (vrdmactl transports): none of it was
    // copied by the shim's CPU.
    struct Stats {
        uint64_t sends = 0, send_bytes = 0, recvs = 0, completions = 0, errors = 0;
        // Datagrams for a UD QP on the device that came another way (TCP
        // from a shim without a device, memcpy from a QP of this shim off
        // the device): its receives are on the device, so they are lost.
        uint64_t ud_lost = 0;
        // Datagrams from a QP no shim announced (hca_ud.h): no source LID.
        uint64_t ud_unknown = 0;
    };
    const Stats& stats() const { return stats_; }
    Stats& stats() { return stats_; }
    void count_send(uint64_t bytes) {
        ++stats_.sends;
        stats_.send_bytes += bytes;
    }

    // The device SRQ whose work requests carry `id` (null if gone).
    DeviceSrq* srq_by_id(uint32_t id) const {
        auto it = srqs_.find(id);
        return it == srqs_.end() ? nullptr : it->second;
    }
    void forget_srq(uint32_t id) { srqs_.erase(id); }

private:
    HcaDevice() = default;
    int post_bind(DeviceQp& q, const SendWork& w, ibv_send_wr& wr, const SendTargets& t);

    std::string name_;
    uint8_t port_ = 1;
    ibv_context* ctx_ = nullptr;
    ibv_comp_channel* channel_ = nullptr;
    ibv_device_attr attr_{};
    ibv_mtu active_mtu_ = IBV_MTU_1024;
    ibv_gid gid_{};
    int gid_index_ = 0;
    // The CQs every device QP completes into: one is opened whenever those
    // open cannot hold a new QP's queues (a QP never overruns its CQ).
    struct SharedCq {
        ibv_cq* cq = nullptr;
        uint32_t size = 0, used = 0;
    };
    std::vector<SharedCq> cqs_;
    std::vector<ibv_wc> wcs_;
    std::unordered_map<uint32_t, DeviceSrq*> srqs_;  // by DeviceSrq::id
    uint32_t next_srq_id_ = 1;
    Stats stats_;
};

}  // namespace vrdma::shim
