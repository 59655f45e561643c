// Which guest QPs go through the device, and their device QPs following
// them (docs/protocol.md "The HCA transport").
//
// On a shim with a device, every RC and UC QP gets a device QP when it is
// created, and takes its QPN; every SRQ gets a device SRQ, which takes the
// guest's receive WQEs once a QP on it is bound, and from then on serves
// bound QPs only. It goes through the device
// (is bound) when it is connected to a guest of a peer shim that has a
// device too (the peer's device GID came in its fabric Hello), and both
// guests are in the default partition; otherwise it goes as it would
// without a device (memcpy on this host, TCP to a peer without one). The
// rule gives the same answer at both ends of a connection. A QP is bound
// at RTR, or later, as soon as the route to its peer appears; it stays
// bound until RESET. A UD QP in the default partition is bound at RTR,
// whoever its datagrams go to (hca_ud.h).
#pragma once

#include <cstdint>
#include <memory>

#include "resources.h"

namespace vrdma::shim {

class Engine;
class Context;
class HcaDevice;
class HcaTransport;
struct DeviceQp;
struct DeviceSrq;

// The device QP for a new guest QP, on the device SRQ of its SRQ if it
// has one (null: the shim has no device, the QP cannot have one, or the
// device refused: the QP then never goes through the device).
std::shared_ptr<DeviceQp> hca_create_qp(HcaDevice& dev, Engine& eng, const Pd& pd, const Srq* srq, uint32_t type,
                                                         uint32_t send_wr, uint32_t recv_wr, uint32_t send_sge,
                                                         uint32_t recv_sge, uint32_t max_inline);

// The device SRQ for a new guest SRQ (null: no device, or it refused).
std::shared_ptr<DeviceSrq> hca_create_srq(HcaDevice& dev, const Pd& pd, uint32_t entries, uint32_t max_sge);

// ModifyQp to `next` with the new attributes already in qp.attr, before
// the guest QP changes state: binds it, or brings its device QP along.
// 0, or the errno the guest's modify fails with (the QP must go through
// the device and cannot).
int hca_follow(HcaTransport& hca, Engine& eng, Context& ctx, Qp& qp, uint32_t next);

// Every pass over a QP (requester_process): binds it if its route appeared
// since, and forwards the receive WQEs the guest posted to the device QP.
void hca_service(HcaTransport& hca, Engine& eng, Context& ctx, Qp& qp);

}  // namespace vrdma::shim
