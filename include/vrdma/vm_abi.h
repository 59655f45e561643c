// The device a QEMU virtual machine sees of its guest (docs/protocol.md
// "VM tenants"): an ivshmem-doorbell PCI device (1af4:1110) whose server
// is the shim. BAR2 is memory the shim made (a sealed memfd, as large as
// the guest's :vm-memory=SIZE); it starts with the device page below. BAR0
// holds ivshmem's registers: the VM rings the shim by writing
// (kVmShimPeer << 16 | vector) to its Doorbell register.
//
// Everything the VM writes into BAR2 is guest input: the shim copies it
// out and validates the copy, as it does with a process's arena.
#pragma once

#include <atomic>
#include <cstdint>

namespace vrdma::abi {

constexpr uint64_t kVmMagic = 0x4d562d414d445276ull;  // "vRDMA-VM", little-endian
constexpr uint32_t kVmVersion = 2;  // 1: the device page (identity, doorbell count); 2: the mailbox

// ivshmem peers: the shim is peer 0 on each VM guest's socket, the VM
// (QEMU) peer 1. Each has kVmVectors vectors.
constexpr uint16_t kVmShimPeer = 0;
constexpr uint16_t kVmPeer = 1;
constexpr uint32_t kVmVectors = 2;
// VM -> shim: wake the worker (a doorbell rung while the shim sleeps).
constexpr uint32_t kVmVectorKick = 0;
// Shim -> VM: an event for the VM (MSI-X vector 1 of its device).
constexpr uint32_t kVmVectorEvent = 1;
// BAR0: the ivshmem registers.
constexpr uint32_t kIvshmemIvPosition = 8;  // read: the VM's peer ID
constexpr uint32_t kIvshmemDoorbell = 12;   // write: peer << 16 | vector

// The sizes a VM guest's memory may have: a power of two (a PCI BAR is),
// from 4 MiB to 64 GiB.
constexpr uint64_t kVmMinMemory = 4ull << 20;
constexpr uint64_t kVmMaxMemory = 64ull << 30;
constexpr uint64_t kVmDefaultMemory = 64ull << 20;

// At offset 0 of BAR2, written by the shim when QEMU connects. The VM
// may write it too (it is shared memory); the shim never reads it back.
struct VmDevicePage {
    uint64_t magic;          // kVmMagic
    uint32_t version;        // kVmVersion
    uint32_t page_size;      // 4096
    uint64_t memory_bytes;   // BAR2's size
    uint64_t guid;           // the guest's node and port GUID (host byte order)
    uint16_t lid;            // the guest's LID
    uint16_t reserved0;
    uint32_t vm_peer;        // kVmPeer
    char guest_name[64];     // NUL-terminated
    // The shim's view, updated as it changes.
    alignas(64) std::atomic<uint32_t> shim_state;  // kShimRunning, or a fatal state (abi.h)
    uint32_t reserved1;
    std::atomic<uint64_t> kicks;                    // VM -> shim doorbells the shim took
    uint8_t reserved2[4096 - 128 - 16];
};
static_assert(sizeof(VmDevicePage) == 4096);

// The mailbox, BAR2's second page: the VM's agent (vrdma-vm-agent, the one
// writer on the VM's side) posts one request at a time and rings the shim
// (kVmVectorKick); the shim copies the request out, checks it, answers,
// and publishes the answer's sequence number. An "owner" is the agent's
// name for one process's connection: the memory regions and the context
// of that process, all freed by Close (or when QEMU goes).
enum class VmOp : uint32_t {
    Alloc = 1,   // a region of `len` bytes (a page multiple) for `owner`: reply.offset
    Free = 2,    // `owner`'s region at `offset`
    Attach = 3,  // `owner`'s context: its arena is its region at `offset`, `len` bytes, mapped at `gva`
    Close = 4,   // everything of `owner`
    // A segment of `owner`'s context (docs/protocol.md "Guest memory"):
    // [gva, gva + len) is [offset, offset + len) of one of its regions.
    AddSegment = 5,
    RemoveSegment = 6,  // `owner`'s segment `seg_id`
    // `owner`'s context detaches (its process closed the device); its
    // regions stay: the process's pages moved there stay mapped until it
    // exits, when the agent sends Close.
    Detach = 7,
    // Nothing (owner 0 allowed): answered at once. The agent asks when it
    // has asked nothing for a second, so that a shim that stopped answering
    // (killed, with no chance to write shim_state) is noticed.
    Ping = 8,
};
struct VmRequest {
    VmOp op;
    uint32_t seg_id;  // AddSegment, RemoveSegment: the provider's id, nonzero
    uint64_t owner;   // nonzero
    uint64_t offset;  // Free, Attach, AddSegment: an offset in BAR2
    uint64_t len;     // Alloc, Attach, AddSegment
    uint64_t gva;     // Attach, AddSegment
};
static_assert(sizeof(VmRequest) == 40);
struct VmReply {
    int32_t status;   // 0 or a positive errno
    uint32_t lid;     // Attach: the guest's LID
    uint64_t offset;  // Alloc: the region's offset in BAR2
    char message[112];  // NUL-terminated, why a request failed
};
static_assert(sizeof(VmReply) == 128);
struct VmMailbox {
    alignas(64) std::atomic<uint32_t> request_seq;  // the agent's, after writing `request`
    alignas(64) std::atomic<uint32_t> reply_seq;    // the shim's: the request_seq it answered
    alignas(64) VmRequest request;
    alignas(64) VmReply reply;
};
static_assert(sizeof(VmMailbox) <= 4096);
constexpr uint64_t kVmMailboxOffset = 4096;
// Regions are handed out from here on, in pages.
constexpr uint64_t kVmHeapOffset = 2 * 4096;
// What one VM may hold: owners (its processes' connections) and regions each.
constexpr uint32_t kVmMaxOwners = 1024;
constexpr uint32_t kVmMaxRegionsPerOwner = 4096;

}  // namespace vrdma::abi
