// Completion channels and async events in the provider (docs/protocol.md
// "Events").
//
// libibverbs creates completion channels with a kernel command and gives
// providers no hook for it, so this library, when LD_PRELOADed (vrdma-run
// does it), defines ibv_create_comp_channel, ibv_destroy_comp_channel,
// ibv_get_cq_event and ibv_get_async_event for the whole process. Calls for
// contexts and channels of other devices go to libibverbs' own functions.
//
// A vrdma channel is a pipe: the application reads its read end (the
// channel's fd, usable with poll and epoll); the shim alone holds the write
// end and writes one 8-byte record, the ibv_cq pointer, per completion event,
// exactly as the kernel does. The async fd is a pipe written by the shim
// alone as well (16-byte ib_uverbs_async_event_desc records). When the shim
// goes away both reach end-of-file: ibv_get_cq_event fails, and
// ibv_get_async_event reports IBV_EVENT_DEVICE_FATAL once, then fails.
//
// Pipes cannot take back records the way the kernel drops the queued events
// of a destroyed object, so every record is checked against the objects that
// are still alive before it is handed over; a destroyed object that records
// may still name is kept allocated ("zombie") until the context is freed, so
// that its address cannot come back as a new object's.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "context.h"

namespace vrdma::prov {

struct Cq;
struct Qp;
struct Srq;

// verbs_context_ops.cq_event and .async_event: libibverbs calls them after
// it read a record; both count the event on its object (when it is alive).
void cq_event(ibv_cq* cq);
void async_event(ibv_context* ibctx, ibv_async_event* event);

// The process-wide list of open vrdma contexts, for the preloaded entry
// points. unregister_context also detaches the context's channels from it.
void register_context(ibv_context* ibctx, Context* ctx);
void unregister_context(ibv_context* ibctx);
Context* find_vrdma_context(const ibv_context* ibctx);  // null: not a vrdma context
// For ibv_import_device: the registered context whose command fd is the
// same open file as `cmd_fd` (kcmp), with one more user counted, its
// device and a duplicate of its async fd in the out-parameters. Null when
// none is (errno: ENOENT, or why kcmp could not tell).
Context* claim_context_of_cmd_fd(int cmd_fd, ibv_device** device, int* async_fd);

// The shim id of a vrdma channel of `ctx` (0 if the channel is not one).
uint32_t channel_id_of(const ibv_comp_channel* channel, const Context& ctx);
// Inside a VM a channel's write end is the process's (vm_events.h): the
// one of `channel` (-1 if it is not a channel of `ctx`), and closing those
// of all channels of `ctx` when its device went.
int vm_channel_write_fd(const ibv_comp_channel* channel, const Context& ctx);
void close_vm_channels(Context& ctx);

// Called by destroy_cq/qp/srq once the shim destroyed the object (resp) or
// is gone (resp null). Removes the object from the live set and reports
// whether records naming it may still be unread (then the caller keeps it
// as a zombie with keep_zombie instead of deleting it).
bool retire_cq(Context& ctx, Cq& cq, const abi::CmdDestroyResp* resp);
bool retire_qp(Context& ctx, Qp& qp, const abi::CmdDestroyResp* resp);
bool retire_srq(Context& ctx, Srq& srq, const abi::CmdDestroyResp* resp);

template <typename T>
void keep_zombie(Context& ctx, T* obj) {
    std::lock_guard lock(ctx.ev_mu);
    ctx.zombies.emplace_back(obj, [](void* p) { delete static_cast<T*>(p); });
}

// Waits until `*completed` (an ibv_* object's count of acknowledged events,
// guarded by its mutex and signalled on its cond by ibv_ack_*) reaches
// `handed`, as the kernel-backed destroy verbs do.
void wait_acked(pthread_mutex_t* mu, pthread_cond_t* cond, const unsigned int* completed, uint32_t handed,
                const unsigned int* completed2 = nullptr, uint32_t handed2 = 0);

// True once the shim is known to be gone (a failed command, its fatal mark
// in the control block, or a hung-up socket); marks the context dead.
bool shim_lost(Context& ctx);

}  // namespace vrdma::prov
