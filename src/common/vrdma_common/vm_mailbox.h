// The VM side of a VM guest's mailbox (vm_abi.h): one request at a time,
// for the VM's agent (tools/vrdma-vm-agent) and the tests that play it.
#pragma once

#include <cstdint>
#include <functional>

#include "vrdma/vm_abi.h"

namespace vrdma {

class VmMailboxClient {
public:
    // `page`: BAR2's start as mapped in this process; `ring`: rings the
    // shim (the Doorbell register, peer kVmShimPeer, vector kVmVectorKick).
    VmMailboxClient(void* bar2, std::function<void()> ring);
    // Posts `q` and waits for the shim's answer (at most `timeout_ms`).
    // Returns the reply's status (0 or a positive errno), or ETIMEDOUT /
    // ESHUTDOWN when the shim did not answer or its device is gone.
    int call(const abi::VmRequest& q, abi::VmReply& r, int timeout_ms = 10000);
    const abi::VmDevicePage& page() const { return *page_; }

private:
    abi::VmDevicePage* page_;
    abi::VmMailbox* mb_;
    std::function<void()> ring_;
};

}  // namespace vrdma
