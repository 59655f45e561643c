// The VM guest's device as its agent sees it inside the VM: the
// ivshmem-doorbell PCI device (1af4:1110) whose BAR2 starts with a vrdma
// device page (vm_abi.h), reached through its sysfs resource files.
#pragma once

#include <cstdint>
#include <string>

#include "vrdma/vm_abi.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::vm {

struct VmDevice {
    std::string pci;  // /sys/bus/pci/devices/ADDR
    UniqueFd bar0, bar2;  // resource0 and resource2, open read-write
    void* regs = nullptr;  // BAR0, one page
    void* mem = nullptr;   // BAR2's first pages: the device page and the mailbox
    ~VmDevice();
    const abi::VmDevicePage& page() const { return *static_cast<const abi::VmDevicePage*>(mem); }
    // Rings the shim: the Doorbell register, peer kVmShimPeer, vector kVmVectorKick.
    void ring() const;
};

// Opens the device at `pci_addr` ("0000:00:06.0"), or the first ivshmem
// device whose BAR2 holds a vrdma device page when empty: enables it and
// maps what the agent reads. False with `error` saying why.
bool open_vm_device(const std::string& pci_addr, VmDevice& out, std::string& error);

}  // namespace vrdma::vm
