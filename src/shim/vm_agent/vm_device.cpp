#include "vm_device.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

namespace vrdma::vm {
namespace {

constexpr size_t kMapped = 2 * 4096;  // the device page and the mailbox

std::string read_line(const std::string& path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

// Opens and maps `dir`'s device; false (and `why`) when it is not one of
// ours.
bool try_device(const std::string& dir, VmDevice& d, std::string& why) {
    if (read_line(dir + "/vendor") != "0x1af4" || read_line(dir + "/device") != "0x1110") {
        why = "not an ivshmem device";
        return false;
    }
    // A device without a driver has its memory decoding off until enabled.
    if (std::ofstream en(dir + "/enable"); en) en << "1";
    d.pci = dir;
    d.bar0.reset(::open((dir + "/resource0").c_str(), O_RDWR | O_CLOEXEC | O_SYNC));
    d.bar2.reset(::open((dir + "/resource2").c_str(), O_RDWR | O_CLOEXEC));
    if (!d.bar0 || !d.bar2) {
        why = std::string("cannot open its BARs (") + strerror(errno) + "): the agent runs as root";
        return false;
    }
    d.regs = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, d.bar0.get(), 0);
    d.mem = ::mmap(nullptr, kMapped, PROT_READ | PROT_WRITE, MAP_SHARED, d.bar2.get(), 0);
    if (d.regs == MAP_FAILED || d.mem == MAP_FAILED) {
        if (d.regs == MAP_FAILED) d.regs = nullptr;
        if (d.mem == MAP_FAILED) d.mem = nullptr;
        why = std::string("cannot map its BARs: ") + strerror(errno);
        return false;
    }
    const abi::VmDevicePage& p = d.page();
    if (p.magic != abi::kVmMagic) {
        why = "its memory holds no vrdma device page (is its server a vrdma-shim VM guest?)";
        return false;
    }
    if (p.version != abi::kVmVersion) {
        why = "its device page is version " + std::to_string(p.version) + ", this agent speaks " +
              std::to_string(abi::kVmVersion) + " (update the agent or the shim)";
        return false;
    }
    return true;
}

}  // namespace

VmDevice::~VmDevice() {
    if (regs) ::munmap(regs, 4096);
    if (mem) ::munmap(mem, kMapped);
}

void VmDevice::ring() const {
    auto* doorbell = reinterpret_cast<volatile uint32_t*>(static_cast<uint8_t*>(regs) + abi::kIvshmemDoorbell);
    *doorbell = (uint32_t(abi::kVmShimPeer) << 16) | abi::kVmVectorKick;
}

bool open_vm_device(const std::string& pci_addr, VmDevice& out, std::string& error) {
    const std::string base = "/sys/bus/pci/devices";
    std::vector<std::string> candidates;
    if (!pci_addr.empty()) {
        candidates.push_back(base + "/" + pci_addr);
    } else if (DIR* d = ::opendir(base.c_str())) {
        while (dirent* e = ::readdir(d))
            if (e->d_name[0] != '.') candidates.push_back(base + "/" + e->d_name);
        ::closedir(d);
    }
    std::string why;
    for (const std::string& c : candidates) {
        VmDevice d;
        if (try_device(c, d, why)) {
            out.pci = d.pci;
            out.bar0 = std::move(d.bar0);
            out.bar2 = std::move(d.bar2);
            std::swap(out.regs, d.regs);
            std::swap(out.mem, d.mem);
            return true;
        }
        if (!pci_addr.empty()) break;
    }
    error = pci_addr.empty() ? "no vrdma VM device (an ivshmem-doorbell device served by vrdma-shim) in " + base
                             : pci_addr + ": " + why;
    return false;
}

}  // namespace vrdma::vm
