#include "vrdma_common/vm_mailbox.h"

#include <time.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "vrdma/abi.h"

namespace vrdma {

VmMailboxClient::VmMailboxClient(void* bar2, std::function<void()> ring)
    : page_(static_cast<abi::VmDevicePage*>(bar2)),
      mb_(reinterpret_cast<abi::VmMailbox*>(static_cast<uint8_t*>(bar2) + abi::kVmMailboxOffset)),
      ring_(std::move(ring)) {}

int VmMailboxClient::call(const abi::VmRequest& q, abi::VmReply& r, int timeout_ms) {
    std::memcpy(&mb_->request, &q, sizeof(q));
    const uint32_t seq = mb_->reply_seq.load(std::memory_order_acquire) + 1;
    mb_->request_seq.store(seq ? seq : 1, std::memory_order_release);
    ring_();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    // The shim answers within its next pass; polled, since a VM without a
    // driver for the device's interrupts has no event to sleep on.
    timespec pause{0, 20'000};
    while (mb_->reply_seq.load(std::memory_order_acquire) != (seq ? seq : 1)) {
        if (page_->shim_state.load(std::memory_order_acquire) != abi::kShimRunning) return ESHUTDOWN;
        if (std::chrono::steady_clock::now() > deadline) return ETIMEDOUT;
        ::nanosleep(&pause, nullptr);
        if (pause.tv_nsec < 1'000'000) pause.tv_nsec *= 2;
    }
    std::memcpy(&r, &mb_->reply, sizeof(r));
    r.message[sizeof(r.message) - 1] = 0;
    return r.status;
}

}  // namespace vrdma
