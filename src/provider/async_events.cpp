// Async events (events.h): the preloaded ibv_get_async_event, the
// async_event op, and the bookkeeping that lets destroy verbs wait for
// acknowledgements and drop stale records.
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "events.h"
#include "objects.h"

namespace vrdma::prov {
namespace {

// The element of a record, by event type, as libibverbs maps it.
void set_element(ibv_async_event& ev, uint64_t element) {
    switch (ev.event_type) {
    case IBV_EVENT_CQ_ERR:
        ev.element.cq = reinterpret_cast<ibv_cq*>(uintptr_t(element));
        break;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
        ev.element.qp = reinterpret_cast<ibv_qp*>(uintptr_t(element));
        break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
        ev.element.srq = reinterpret_cast<ibv_srq*>(uintptr_t(element));
        break;
    case IBV_EVENT_WQ_FATAL:
        ev.element.wq = reinterpret_cast<ibv_wq*>(uintptr_t(element));
        break;
    default:
        ev.element.port_num = int(element);
        break;
    }
}

// Counts the event on its object. False if the object is gone (a stale
// record) or the event is a second DEVICE_FATAL.
bool account(Context& ctx, const ibv_async_event& ev) {
    std::lock_guard lock(ctx.ev_mu);
    switch (ev.event_type) {
    case IBV_EVENT_CQ_ERR:
        if (!ctx.live_cqs.count(ev.element.cq)) return false;
        ++to_cq(ev.element.cq)->async_read;
        return true;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
        if (!ctx.live_qps.count(ev.element.qp)) return false;
        ++to_qp(ev.element.qp)->async_read;
        return true;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
        if (!ctx.live_srqs.count(ev.element.srq)) return false;
        ++to_srq(ev.element.srq)->async_read;
        return true;
    case IBV_EVENT_WQ_FATAL:
        return false;  // no WQs on this device
    case IBV_EVENT_DEVICE_FATAL:
        if (ctx.fatal_reported) return false;
        ctx.fatal_reported = true;
        return true;
    default:
        return true;
    }
}

}  // namespace

void async_event(ibv_context* ibctx, ibv_async_event* event) {
    Context& ctx = ctx_of(ibctx);
    account(ctx, *event);
    if (event->event_type == IBV_EVENT_DEVICE_FATAL) mark_dead(ctx, "the device reported IBV_EVENT_DEVICE_FATAL");
}

bool retire_qp(Context& ctx, Qp& qp, const abi::CmdDestroyResp* resp) {
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_qps.erase(&qp.vqp.qp);
    return !resp || resp->async_events != qp.async_read;
}

bool retire_srq(Context& ctx, Srq& srq, const abi::CmdDestroyResp* resp) {
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_srqs.erase(&srq.vsrq.srq);
    return !resp || resp->async_events != srq.async_read;
}

// Reads the next record of a vrdma context's async pipe. Stale records are
// skipped; end of file (the shim is gone: it held the only write end)
// becomes one IBV_EVENT_DEVICE_FATAL, and a failure after that.
int get_async_event(Context& ctx, ibv_context* ibctx, ibv_async_event* event) {
    for (;;) {
        abi::AsyncRecord rec;
        ssize_t n = ::read(ibctx->async_fd, &rec, sizeof(rec));
        if (n == ssize_t(sizeof(rec))) {
            ibv_async_event ev{};
            ev.event_type = static_cast<ibv_event_type>(rec.event_type);
            set_element(ev, rec.element);
            if (!account(ctx, ev)) continue;
            if (ev.event_type == IBV_EVENT_DEVICE_FATAL) {
                const uint32_t state = ctx.cb->shim_state.load(std::memory_order_acquire);
                mark_dead(ctx, state == abi::kGuestRemoved ? shim_state_reason(state) : "the shim is shutting down");
            }
            *event = ev;
            return 0;
        }
        if (n < 0) return -1;
        if (n == 0) {
            ibv_async_event ev{};
            ev.event_type = IBV_EVENT_DEVICE_FATAL;
            ev.element.port_num = 0;
            if (account(ctx, ev)) {
                mark_dead(ctx, "the shim went away");
                *event = ev;
                return 0;
            }
        }
        errno = EIO;
        return -1;
    }
}

}  // namespace vrdma::prov

using namespace vrdma::prov;

extern "C" [[gnu::visibility("default")]] int ibv_get_async_event(ibv_context* ibctx, ibv_async_event* event) {
    if (Context* ctx = ibctx ? find_vrdma_context(ibctx) : nullptr) return get_async_event(*ctx, ibctx, event);
    using Fn = int (*)(ibv_context*, ibv_async_event*);
    auto fn = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "ibv_get_async_event"));
    if (!fn) {
        errno = ENOSYS;
        return -1;
    }
    return fn(ibctx, event);
}
