// UD through the device (docs/protocol.md "The HCA transport").
//
// On a shim with a device, a UD QP in the default partition is on the
// device from RTR to RESET (bound, hca_bind.h): its receives go to its
// device QP, and its datagrams go through the device to every UD QP that is
// on a device too: a guest's of this shim (the device's loopback), and any
// of a peer shim with a device (the same rule put it there). Datagrams to
// other QPs go as without a device (memcpy, TCP to a shim without one).
//
// A device delivers a datagram with the sending device's GID (in the 40
// bytes before the payload, a RoCE device's IP header, which the device
// writes into the shim's memory: HeaderSlots) and the sending QPN; the
// receiving shim finds the guest behind them (its own QP table,
// or what the sending shim announced over the fabric when the QP reached
// RTR, SegType::UdQp) and writes the guest's view over those 40 bytes: an
// InfiniBand GRH from the sending guest's GID to the receiving guest's, as
// vrdma's other paths do.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "vrdma/abi.h"

namespace vrdma::shim {

class Engine;
class Context;
class HcaDevice;
struct Qp;
struct Ah;
struct Pd;

// What a device wrote in the 40 bytes before a datagram's payload: a RoCE
// v2 device an IPv4 header in the last 20 (or an IPv6 header), an
// InfiniBand or RoCE v1 one a GRH, laid out as IPv6. The sender's address
// as a GID (IPv4-mapped for IPv4). False if it is neither.
struct DeviceHeader {
    uint8_t sgid[16] = {};
    uint8_t traffic_class = 0;
    uint8_t hop_limit = 0;
};
bool parse_device_header(const uint8_t header[40], DeviceHeader& out);

// The device GID a datagram to (dlid, dqpn) goes to through the device;
// null when the destination is not a UD QP on a device (the datagram goes
// as without one).
const uint8_t* hca_ud_destination(const HcaDevice& dev, Engine& eng, uint16_t dlid, uint32_t dqpn);

// The device AH of guest AH `ah` (of PD `pd`) towards `gid`, made now if
// it has none or one to another GID. Null if the device refused.
ibv_ah* hca_ud_ah(HcaDevice& dev, const Pd& pd, Ah& ah, const uint8_t* gid);

// A UD datagram the device delivered, its network header in `header`
// (the WQE's header slot: HeaderSlots) and its payload after the first 40
// bytes of the guest's scatter list `sge`: names its source in the guest's
// CQE `c` (source QPN and LID) and writes the guest's GRH in those 40 bytes.
void hca_ud_received(HcaDevice& dev, Engine& eng, Context& ctx, const Qp& qp, const ibv_wc& wc, const uint8_t* header,
                     const abi::Sge* sge, uint32_t nsge, abi::Cqe& c);

}  // namespace vrdma::shim
