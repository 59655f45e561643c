// Device completions and events into the guests' CQs and async pipes.
//
// Every device work request carries its guest ring index and the device
// QP's generation (hca_device.cpp). A send completion completes the guest
// WQE at the head of its send queue (requester_carried_done), a receive
// completion the one at the head of its receive queue: the device
// completes a QP's work in the order it was posted. A completion that is
// not for the head (its QP was flushed by the shim, reset or destroyed
// since) is dropped.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace vrdma::shim {

class Engine;
class HcaDevice;
struct DeviceSrq;

struct DeviceCompletion {
    uint32_t qpn = 0;
    bool recv = false;
    DeviceSrq* srq = nullptr;  // an SRQ receive (its shadow slot already free again)
    uint64_t srq_wr_id = 0;    //   and the guest's wr_id
    uint32_t gen = 0;
    uint32_t idx = 0;
    const ibv_wc* wc = nullptr;
};

void deliver_device_completion(HcaDevice& dev, Engine& eng, const DeviceCompletion& dc);

// An async event of the device: QP events go to the guest QP (the device
// QP's QPN is the guest's), port events to every guest of the shim.
void deliver_device_event(Engine& eng, HcaDevice& dev, const ibv_async_event& ev);

}  // namespace vrdma::shim
