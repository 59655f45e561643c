#include "context.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "vrdma_common/log.h"

namespace vrdma::shim {

Context::Context(uint64_t id, const GuestIdentity& guest, const Quotas& quotas, std::shared_ptr<Mapping> arena,
                 UniqueFd kick, UniqueFd cmd_done, UniqueFd async)
    : pds(quotas.max_pd),
      mrs(quotas.max_mr),
      cqs(quotas.max_cq),
      qps(quotas.max_qp),
      srqs(quotas.max_srq),
      ahs(quotas.max_ah),
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

void Context::signal_cmd_done() {
    if (!cmd_done_) return;
    uint64_t one = 1;
    ssize_t n = ::write(cmd_done_.get(), &one, sizeof(one));
    (void)n;
}

void Context::post_async_event(uint32_t event_type, uint64_t element) {
    LOG_DEBUG("context %llu: async event %u element 0x%llx", (unsigned long long)id_, event_type,
              (unsigned long long)element);
    if (!async_) return;
    struct {
        uint64_t element;
        uint32_t event_type;
        uint32_t reserved;
    } rec{element, event_type, 0};
    ssize_t n = ::write(async_.get(), &rec, sizeof(rec));
    if (n != ssize_t(sizeof(rec)))
        LOG_WARN("context %llu: async event %u lost (%s)", (unsigned long long)id_, event_type,
                 n < 0 ? strerror(errno) : "short write");
}

}  // namespace vrdma::shim
