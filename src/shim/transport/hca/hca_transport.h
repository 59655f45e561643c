// The HCA transport: the guest QPs bound to the device (hca_bind.h) send
// through it. A request is the guest's WQE posted on the device QP as it
// is (keys and addresses are the device's: hca_device.h); the device
// moves the payload by DMA from and to the guests' memory, retries,
// acknowledges and orders, and its completion completes the guest's WQE
// (hca_completions.h). The shim's CPU copies none of the payload.
#pragma once

#include "hca_device.h"
#include "transport.h"

namespace vrdma::shim {

// What a device QP can carry of what the guest may post (BIND_MW and
// LOCAL_INV too, posted by the requester's local operations; atomic write
// is not: rxe on the kernels here has none).
inline bool device_opcode(uint32_t op) {
    switch (op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
        return true;
    default:
        return false;
    }
}

class HcaTransport final : public Transport {
public:
    explicit HcaTransport(HcaDevice& dev) : dev_(dev) {}
    HcaDevice& device() { return dev_; }
    const char* name() const override { return "hca"; }
    // `req.wqe` is posted; `local` is not used (the device reads and writes
    // the memory itself).
    SendResult send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local, uint32_t nlocal,
                    Pins* pins, Response& resp) override;
    // The device answers every request it took, in time or with its own
    // RETRY_EXC_ERR: the shim's timers never fire for it.
    bool delivering_since(uint64_t) const override { return true; }

    // The guest's objects get the device's beside them (hca_bind.h).
    const uint8_t* own_device_gid() const override { return dev_.gid(); }
    void limit_device(abi::DeviceAttr& a) const override;
    int pd_made(Engine& eng, Pd& pd) override;
    int mr_made(Engine& eng, const Pd& pd, const Mr& mr, const MrShape& shape, bool rereg,
                Kept& made, uint32_t& key) override;
    void mw_made(Engine& eng, const Pd& pd, uint32_t type, Kept& made,
                 uint32_t& key) override;
    void srq_made(Engine& eng, const Pd& pd, Srq& srq) override;
    uint32_t qp_made(Engine& eng, const Pd& pd, const Srq* srq, Qp& qp, const abi::CmdCreateQpReq& r) override;
    int qp_moving(Engine& eng, Context& ctx, Qp& qp, uint32_t next) override;
    void qp_failed(Qp& qp) override;
    void datagram_missed(const Qp& qp) override;

    // The QPs bound to it.
    void qp_pass(Engine& eng, Context& ctx, Qp& qp) override;
    bool carries_opcode(uint32_t op) const override { return device_opcode(op); }
    bool carries_datagram(Engine& eng, uint16_t dlid, uint32_t dqpn) override;
    uint64_t datagram_mtu() const override { return dev_.mtu_bytes(); }
    uint32_t check_local_op(const Qp& qp, const Mw* mw, bool bind) const override;
    LocalOp post_local_op(Engine& eng, Context& ctx, Qp& qp, Mw* mw, SendWork& w, bool bind) override;

private:
    HcaDevice& dev_;
};

}  // namespace vrdma::shim
