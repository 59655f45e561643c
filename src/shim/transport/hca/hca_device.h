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

#include "vrdma/abi.h"

namespace vrdma::shim {

class Engine;
class HcaDevice;
struct SendWork;
struct RecvWork;

struct DevicePd {
    ibv_pd* pd = nullptr;
    ~DevicePd();
};

struct DeviceMr {
    ibv_mr* mr = nullptr;
    std::shared_ptr<DevicePd> pd;  // deallocated after its last MR and QP
    ~DeviceMr();
};
// The guest's lkey and rkey: the device's lkey (a device gives an MR with
// remote access the same rkey; one without has no rkey to use).
inline uint32_t device_mr_key(const DeviceMr& m) { return m.mr->lkey; }

// The device SRQ of a guest SRQ (created with it). Once a QP on the SRQ
// is bound (Srq::feeds_device), the shim moves the guest's receive WQEs from the
// guest's ring into the device SRQ, keeping each one's wr_id in a shadow
// slot named by the device work request id, and gives the guest its ring
// slot back at once: the device completes SRQ WQEs in any order. From
// then on only bound QPs may use the SRQ (hca_bind.cpp). Its work request
// ids name it (`id`, HcaDevice's table), so a completion gives its slot
// back whatever became of the QP that took the WQE.
struct DeviceSrq {
    ibv_srq* srq = nullptr;
    HcaDevice* owner = nullptr;
    uint32_t id = 0;
    bool broken = false;  // the guest posted a WQE the device cannot take: no more are forwarded
    std::shared_ptr<DevicePd> pd;
    std::vector<uint64_t> wr_ids;    // by shadow slot: the guest's wr_id
    std::vector<uint8_t> on_device;  // by shadow slot
    std::vector<uint32_t> free;      // shadow slots not on the device
    ~DeviceSrq();
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
// bound is the guest QP's `device_bound`.
struct DeviceQp {
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
    ~DeviceQp();
    // ERR: the device flushes what was posted (the guest QP's flush answers
    // for it: hca_completions.h). RESET: a new life.
    int to_error();
    int to_reset();
};

class HcaDevice {
public:
    ~HcaDevice();

    // Opens "DEV" or "DEV:PORT" (names as ibv_devices prints them): the
    // port must be active; its GID for the fabric is the IPv4-mapped RoCE
    // GID if there is one, else the first non-zero GID. Null and `error`
    // on failure.
    static std::unique_ptr<HcaDevice> open(const std::string& spec, std::string& error);

    const std::string& name() const { return name_; }
    uint8_t port() const { return port_; }
    const uint8_t* gid() const { return gid_.raw; }
    int gid_index() const { return gid_index_; }
    ibv_mtu active_mtu() const { return active_mtu_; }
    std::string describe() const;

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

    // The device QP follows its guest QP to INIT, RTR and RTS with the
    // guest's attributes; the path is the peer shim's device GID.
    int to_rtr(DeviceQp& q, const abi::QpAttr& a, const uint8_t* peer_gid);
    int to_rts(DeviceQp& q, const abi::QpAttr& a);

    // Posts the guest's send WQE (already validated by the requester) as
    // ring index `idx`, and the guest's receive WQE `idx`. 0 or an errno.
    int post_send(DeviceQp& q, const SendWork& w, uint32_t idx);
    int post_recv(DeviceQp& q, const RecvWork& w, uint32_t idx);
    // Posts the guest's SRQ receive WQE into a free shadow slot. 0 or an
    // errno (ENOSPC: the device SRQ is full).
    int post_srq_recv(DeviceSrq& s, const RecvWork& w);

    // Moves device completions into the guest CQs. True if any.
    bool poll(Engine& eng);
    // Before sleeping: asks for a completion event; the fd (comp_fd) is
    // then readable when one arrives. After waking: consume_events.
    void arm();
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
    };
    const Stats& stats() const { return stats_; }
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
