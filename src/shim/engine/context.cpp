#include "context.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "guest_fd.h"
#include "vrdma/ring.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {

Context::Context(uint64_t id, const GuestIdentity& guest, const Quotas& quotas, std::shared_ptr<Mapping> arena,
                 UniqueFd kick, UniqueFd cmd_done, UniqueFd async, GuestUsage* usage)
    : charges(usage),
      pds(quotas.max_pd),
      mrs(quotas.max_mr),
      cqs(quotas.max_cq),
      qps(quotas.max_qp),
      srqs(quotas.max_srq),
      ahs(quotas.max_ah),
      mws(quotas.max_mw),
      xrcds(quotas.max_pd),
      id_(id),
      guest_(&guest),
      quotas_(&quotas),
      arena_(arena),
      cb_(reinterpret_cast<abi::ControlBlock*>(arena->base)),
      kick_(std::move(kick)),
      cmd_done_(std::move(cmd_done)),
      async_(std::move(async)) {
    segments.insert(0, std::move(arena));
    if (async_) {
        int fl = ::fcntl(async_.get(), F_GETFL);
        if (fl >= 0) ::fcntl(async_.get(), F_SETFL, fl | O_NONBLOCK);
    }
    cmd_cons = 0;
    cb_->cmd_consumer.store(0, std::memory_order_release);
    cb_->shim_state.store(abi::kShimRunning, std::memory_order_release);
}

// A guest fd call that the guard timer interrupted was blocking: the guest
// cleared O_NONBLOCK on the file it shares with us, which the provider never
// does. Each such call costs the shim's only thread kGuestFdTimeoutMs, so the
// context is detached at the first one rather than at every event.
void Context::check_blocked(ssize_t n, const char* fd_name) {
    if (n >= 0 || errno != EINTR || dead) return;
    LOG_WARN("guest %s: context %llu: its %s blocked the shim (O_NONBLOCK cleared): detaching it",
             guest_->name.c_str(), (unsigned long long)id_, fd_name);
    mark_dead();
}

void Context::signal_cmd_done() {
    if (!cmd_done_ || dead) return;
    uint64_t one = 1;
    ssize_t n = guest_fd_write(cmd_done_.get(), &one, sizeof(one));
    check_blocked(n, "cmd-done eventfd");
}

bool Context::post_async_event(uint32_t event_type, uint64_t element) {
    LOG_DEBUG("context %llu: async event %u element 0x%llx", (unsigned long long)id_, event_type,
              (unsigned long long)element);
    if (dead) return false;
    abi::AsyncRecord rec{element, event_type, 0};
    if (vm_async_) return post_vm_async(rec);
    if (!async_) return false;
    ssize_t n = guest_fd_write(async_.get(), &rec, sizeof(rec));
    if (n == ssize_t(sizeof(rec))) return true;
    const int e = errno;
    check_blocked(n, "async event pipe");
    errno = e;
    if (!warned_lost_event_) {
        warned_lost_event_ = true;
        LOG_WARN("context %llu: async event %u lost (%s); further losses of this context are not logged",
                 (unsigned long long)id_, event_type, n < 0 ? strerror(errno) : "short write");
    }
    return false;
}

bool Context::post_vm_async(const abi::AsyncRecord& rec) {
    auto* ring = reinterpret_cast<abi::VmAsyncRing*>(reinterpret_cast<uint8_t*>(cb_) + abi::kVmAsyncRingOffset);
    const uint32_t cons = ring->consumer.load(std::memory_order_acquire);  // the VM's: checked
    if (!ring_valid_consumer(cons, vm_async_prod_, abi::kVmAsyncSlots) ||
        ring_full(vm_async_prod_, cons, abi::kVmAsyncSlots)) {
        if (!warned_lost_event_) {
            warned_lost_event_ = true;
            LOG_WARN("context %llu: async event %u lost (the VM's ring is full or its consumer index is bad); further "
                     "losses of this context are not logged",
                     (unsigned long long)id_, rec.event_type);
        }
        return false;
    }
    std::memcpy(&ring->slots[ring_slot(vm_async_prod_, abi::kVmAsyncSlots)], &rec, sizeof(rec));
    vm_async_prod_ = ring_next(vm_async_prod_, abi::kVmAsyncSlots);
    ring->producer.store(vm_async_prod_, std::memory_order_release);
    return true;
}

int Context::add_channel(uint32_t id, UniqueFd write_end) {
    if (id == 0) return EINVAL;
    if (channels_.count(id)) return EEXIST;
    if (channels_.size() >= kMaxChannels) return ENOMEM;
    // Only a pipe: a write to it never blocks once O_NONBLOCK is set and
    // never reaches a file system.
    struct stat st;
    if (::fstat(write_end.get(), &st) != 0 || !S_ISFIFO(st.st_mode)) return EINVAL;
    int fl = ::fcntl(write_end.get(), F_GETFL);
    if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY || ::fcntl(write_end.get(), F_SETFL, fl | O_NONBLOCK) != 0)
        return EINVAL;
    channels_.emplace(id, std::move(write_end));
    return 0;
}

bool Context::remove_channel(uint32_t id) { return channels_.erase(id) != 0; }

bool Context::post_comp_event(uint32_t channel_id, uint64_t cq_user_handle) {
    auto it = channels_.find(channel_id);
    if (it == channels_.end() || dead) return false;
    ssize_t n = guest_fd_write(it->second.get(), &cq_user_handle, sizeof(cq_user_handle));
    if (n == ssize_t(sizeof(cq_user_handle))) return true;
    const int e = errno;
    check_blocked(n, "completion channel pipe");
    errno = e;
    if (!warned_lost_event_) {
        warned_lost_event_ = true;
        LOG_WARN("context %llu: completion event lost on channel %u (%s); further losses of this context are "
                 "not logged",
                 (unsigned long long)id_, channel_id, n < 0 ? strerror(errno) : "short write");
    }
    return false;
}

}  // namespace vrdma::shim
