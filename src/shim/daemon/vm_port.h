// A VM guest's device (docs/protocol.md "VM tenants"): the shim is the
// ivshmem server of the guest's RUN_DIR/NAME/ivshmem.sock, which one QEMU
// at a time connects to (-chardev socket,path=...,id=ID -device
// ivshmem-doorbell,chardev=ID,vectors=2). For each QEMU it makes the VM's
// memory (BAR2: a memfd sealed against resizing, so that QEMU cannot
// truncate what the shim maps), writes the device page at its start
// (vm_abi.h), and hands QEMU the memory and the eventfds of the doorbells
// both ways, as QEMU's ivshmem server protocol says (protocol version 0:
// 8-byte little-endian numbers, each with at most one fd).
//
// The VM's agent (vrdma-vm-agent, inside the VM) asks for regions of that
// memory and attaches its processes' contexts through the mailbox
// (vm_abi.h); each context's arena is a region, mapped by the shim as a
// host process's memfd is. The VM rings the shim (vector kVmVectorKick)
// after a request and when a context's doorbell finds the shim asleep:
// every ring serves the mailbox and wakes every context of the VM.
//
// Owned by the worker that serves the guest, and used only in its thread.
// QEMU's going (its socket closes: the VM was shut down or killed) frees
// everything the VM held; the next QEMU gets new memory.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "device_model.h"
#include "engine.h"
#include "vrdma/vm_abi.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

class VmPort {
public:
    VmPort(Engine& eng, const GuestIdentity& guest, uint64_t memory_bytes)
        : eng_(eng), guest_(guest), memory_bytes_(memory_bytes) {}
    ~VmPort();
    VmPort(const VmPort&) = delete;
    VmPort& operator=(const VmPort&) = delete;

    // A QEMU connected (`sock`, from pid `pid`): its memory, device page and
    // eventfds, sent. False (`sock` closed, a warning logged) when a QEMU
    // is connected already or the handshake failed.
    bool adopt(UniqueFd sock, pid_t pid);
    bool connected() const { return bool(sock_); }
    // QEMU's socket, watched for its going (EPOLLRDHUP).
    int socket_fd() const { return sock_.get(); }
    // The eventfd the VM rings the shim with (vector kVmVectorKick), -1
    // while no QEMU is connected.
    int kick_fd() const { return bells_in_.empty() ? -1 : bells_in_[abi::kVmVectorKick].get(); }
    // The kick eventfd is readable: taken and counted, the mailbox served,
    // the VM's contexts woken.
    void on_kick();
    // QEMU's socket closed or failed: the VM is gone.
    void disconnect(const char* why);

private:
    struct Owner {
        uint32_t regions = 0;
        uint64_t ctx_id = 0;       // 0: not attached
        uint64_t arena_offset = 0;  // attached: its arena's region
    };
    bool make_memory(std::string& error);
    void serve_mailbox();
    // One request, copied out of the mailbox: its answer in `r`.
    void handle(const abi::VmRequest& q, abi::VmReply& r);
    int alloc(uint64_t owner, uint64_t len, uint64_t& offset, const char*& why);
    int free_region(uint64_t owner, uint64_t offset, const char*& why);
    int attach(uint64_t owner, uint64_t offset, uint64_t len, uint64_t gva, std::string& why);
    int add_segment(const abi::VmRequest& q, std::string& why);
    int remove_segment(const abi::VmRequest& q, std::string& why);
    // `owner`'s attached context, or null.
    Context* context_of(uint64_t owner);
    void close_owner(uint64_t owner);
    // The bytes of [offset, offset + len) read as zeros again (the pages go
    // back to the host).
    void zero(uint64_t offset, uint64_t len);
    // One message of the protocol: `value`, with `fd` if not -1.
    bool send_message(int64_t value, int fd, std::string& error);
    abi::VmDevicePage* page() const { return static_cast<abi::VmDevicePage*>(map_); }

    Engine& eng_;
    const GuestIdentity& guest_;
    const uint64_t memory_bytes_;
    // The memory past the mailbox, in regions: free ones by offset (their
    // length), and the ones handed out (length, owner).
    std::map<uint64_t, uint64_t> free_;
    struct Region {
        uint64_t len, owner;
    };
    std::map<uint64_t, Region> used_;
    std::map<uint64_t, Owner> owners_;
    uint32_t answered_ = 0;  // the last request_seq answered
    UniqueFd sock_;
    UniqueFd memory_;
    void* map_ = nullptr;
    // bells_in_: the VM rings the shim (peer kVmShimPeer's vectors);
    // bells_out_: the shim interrupts the VM (peer kVmPeer's vectors).
    std::vector<UniqueFd> bells_in_, bells_out_;
    uint64_t kicks_ = 0;
    std::string qemu_;  // "pid N", for the log
};

}  // namespace vrdma::shim
