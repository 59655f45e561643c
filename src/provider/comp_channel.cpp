// Completion channels (events.h): the preloaded ibv_create_comp_channel,
// ibv_destroy_comp_channel and ibv_get_cq_event, the registry of vrdma
// contexts and channels they consult, and the cq_event op.
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/syscall.h>
#include <poll.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>

#include "events.h"
#include "objects.h"
#include "vrdma/abi.h"

namespace vrdma::prov {
namespace {

struct Channel {
    ibv_comp_channel ch;     // what the application holds (first member)
    Context* ctx = nullptr;  // null once the context was freed
    uint32_t id = 0;
    UniqueFd vm_write;       // inside a VM: the write end (vm_events.h)
};

struct Registry {
    std::mutex mu;
    std::unordered_map<const ibv_context*, Context*> contexts;
    std::unordered_map<const ibv_comp_channel*, Channel*> channels;
};

// Never destroyed: preloaded entry points may run during process exit.
Registry& registry() {
    static Registry* r = new Registry;
    return *r;
}

template <typename Fn>
Fn real(const char* name) {
    return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}

uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// How long ibv_get_cq_event looks for an event before it sleeps in read()
// (VRDMA_EVENT_SPIN_US, default 20; 0: sleep at once). An event that comes
// within it costs no wake-up: the shim's write finds the reader awake.
uint64_t event_spin_ns() {
    static const uint64_t ns = [] {
        const char* s = std::getenv("VRDMA_EVENT_SPIN_US");
        return uint64_t(s ? std::strtoul(s, nullptr, 0) : 20) * 1000;
    }();
    return ns;
}

// Until `fd` is readable or `spin_ns` passed, yielding the CPU between
// looks (a look is a poll() with no timeout). A channel the application
// made non-blocking is left alone: its read returns at once anyway.
void spin_for_event(int fd, uint64_t spin_ns) {
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || (fl & O_NONBLOCK)) return;
    const uint64_t until = now_ns() + spin_ns;
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 0) == 0 && now_ns() < until) sched_yield();
}

}  // namespace

Context* find_vrdma_context(const ibv_context* ibctx) {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.contexts.find(ibctx);
    return it == r.contexts.end() ? nullptr : it->second;
}

void register_context(ibv_context* ibctx, Context* ctx) {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    r.contexts[ibctx] = ctx;
}

void unregister_context(ibv_context* ibctx) {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.contexts.find(ibctx);
    if (it == r.contexts.end()) return;
    Context* ctx = it->second;
    r.contexts.erase(it);
    // An imported context shares the state: the channels stay with it
    // until the last ibv_context over it goes.
    for (auto& [ib, c] : r.contexts)
        if (c == ctx) return;
    for (auto& [p, ch] : r.channels)
        if (ch->ctx == ctx) {
            ch->ctx = nullptr;
            ch->vm_write.reset();  // inside a VM: end of file, as when a host shim drops its end
        }
}

Context* claim_context_of_cmd_fd(int cmd_fd, ibv_device** device, int* async_fd) {
    const pid_t self = ::getpid();
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    int why = ENOENT;
    for (auto& [ib, ctx] : r.contexts) {
        const long same = ::syscall(SYS_kcmp, self, self, KCMP_FILE, cmd_fd, ib->cmd_fd);
        if (same < 0) why = errno;  // ENOSYS, EPERM under a seccomp filter, EBADF
        if (same != 0) continue;
        const int dup = ib->async_fd >= 0 ? ::fcntl(ib->async_fd, F_DUPFD_CLOEXEC, 0) : -1;
        if (ib->async_fd >= 0 && dup < 0) return nullptr;
        ctx->users.fetch_add(1);
        *device = ib->device;
        *async_fd = dup;
        return ctx;
    }
    errno = why;
    return nullptr;
}

uint32_t channel_id_of(const ibv_comp_channel* channel, const Context& ctx) {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.channels.find(channel);
    return it != r.channels.end() && it->second->ctx == &ctx ? it->second->id : 0;
}

int vm_channel_write_fd(const ibv_comp_channel* channel, const Context& ctx) {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.channels.find(channel);
    return it != r.channels.end() && it->second->ctx == &ctx && it->second->vm_write ? it->second->vm_write.get() : -1;
}

void close_vm_channels(Context& ctx) {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    for (auto& [p, ch] : r.channels)
        if (ch->ctx == &ctx) ch->vm_write.reset();  // their readers get end of file
}

void cq_event(ibv_cq* ibcq) {
    Cq* cq = to_cq(ibcq);
    std::lock_guard lock(cq->ctx->ev_mu);
    if (cq->ctx->live_cqs.count(ibcq)) ++cq->comp_read;
}

bool retire_cq(Context& ctx, Cq& cq, const abi::CmdDestroyResp* resp) {
    std::lock_guard lock(ctx.ev_mu);
    ctx.live_cqs.erase(&cq.vcq.cq);
    return !resp || resp->comp_events != cq.comp_read || resp->async_events != cq.async_read;
}

void wait_acked(pthread_mutex_t* mu, pthread_cond_t* cond, const unsigned int* completed, uint32_t handed,
                const unsigned int* completed2, uint32_t handed2) {
    pthread_mutex_lock(mu);
    while (*completed != handed || (completed2 && *completed2 != handed2)) pthread_cond_wait(cond, mu);
    pthread_mutex_unlock(mu);
}

}  // namespace vrdma::prov

using namespace vrdma;
using namespace vrdma::prov;

// ---------------------------------------------------------------------------
// Entry points defined for the whole process when the library is preloaded.
// ---------------------------------------------------------------------------

extern "C" [[gnu::visibility("default")]] ibv_comp_channel* ibv_create_comp_channel(ibv_context* ibctx) {
    Context* ctx = ibctx ? find_vrdma_context(ibctx) : nullptr;
    if (!ctx) {
        auto fn = real<ibv_comp_channel* (*)(ibv_context*)>("ibv_create_comp_channel");
        if (!fn) {
            errno = ENOSYS;
            return nullptr;
        }
        return fn(ibctx);
    }
    auto* chan = new (std::nothrow) Channel{};
    if (!chan) {
        errno = ENOMEM;
        return nullptr;
    }
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
        int e = errno;
        delete chan;
        errno = e;
        return nullptr;
    }
    UniqueFd rd(p[0]), wr(p[1]);
    // The shim's end never blocks it; the application's end blocks in
    // ibv_get_cq_event as a kernel channel does (until it sets O_NONBLOCK).
    int fl = ::fcntl(wr.get(), F_GETFL);
    if (fl >= 0) ::fcntl(wr.get(), F_SETFL, fl | O_NONBLOCK);

    abi::SockChannel msg{};
    msg.hdr = {abi::kMagic, abi::kVersion, abi::SockOp::CreateChannel, 0};
    {
        std::lock_guard lock(ctx->cmd_mu);  // ids are per connection
        msg.channel_id = ctx->next_channel_id++;
        if (ctx->next_channel_id == 0) ctx->next_channel_id = 1;
    }
    const int fds[1] = {wr.get()};
    abi::SockReply reply{};
    if (ctx->in_vm) {
        // The shim cannot reach a pipe of the VM's: the context's event
        // thread writes it (vm_events.h).
        chan->vm_write = std::move(wr);
    } else if (int rc = sock_request(*ctx, &msg, sizeof(msg), fds, &reply)) {
        delete chan;
        errno = rc;
        return nullptr;
    }
    wr.reset();  // the shim holds the only write end: its exit means end-of-file
    chan->ctx = ctx;
    chan->id = msg.channel_id;
    chan->ch.context = ibctx;
    chan->ch.fd = rd.release();
    chan->ch.refcnt = 0;
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    r.channels[&chan->ch] = chan;
    return &chan->ch;
}

extern "C" [[gnu::visibility("default")]] int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
    Registry& r = registry();
    Channel* chan = nullptr;
    {
        std::lock_guard lock(r.mu);
        auto it = r.channels.find(channel);
        if (it != r.channels.end()) chan = it->second;
    }
    if (!chan) {
        auto fn = real<int (*)(ibv_comp_channel*)>("ibv_destroy_comp_channel");
        return fn ? fn(channel) : ENOSYS;
    }
    // libibverbs counts the CQs using a channel under the context's mutex.
    pthread_mutex_lock(&channel->context->mutex);
    bool busy = channel->refcnt != 0;
    pthread_mutex_unlock(&channel->context->mutex);
    if (busy) return EBUSY;
    {
        std::lock_guard lock(r.mu);
        r.channels.erase(channel);
    }
    if (Context* ctx = chan->ctx; ctx && !ctx->in_vm) {
        abi::SockChannel msg{};
        msg.hdr = {abi::kMagic, abi::kVersion, abi::SockOp::DestroyChannel, 0};
        msg.channel_id = chan->id;
        abi::SockReply reply{};
        sock_request(*ctx, &msg, sizeof(msg), {}, &reply);  // a gone shim closed it already
    }
    ::close(channel->fd);
    delete chan;
    return 0;
}

extern "C" [[gnu::visibility("default")]] int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq,
                                                               void** cq_context) {
    Registry& r = registry();
    bool ours;
    {
        std::lock_guard lock(r.mu);
        ours = r.channels.count(channel) != 0;
    }
    if (!ours) {  // a kernel channel: libibverbs reads it
        auto fn = real<int (*)(ibv_comp_channel*, ibv_cq**, void**)>("ibv_get_cq_event");
        if (!fn) {
            errno = ENOSYS;
            return -1;
        }
        return fn(channel, cq, cq_context);
    }
    if (const uint64_t spin = event_spin_ns()) spin_for_event(channel->fd, spin);
    for (;;) {
        uint64_t handle;
        ssize_t n = ::read(channel->fd, &handle, sizeof(handle));
        if (n != ssize_t(sizeof(handle))) {
            if (n >= 0) errno = EIO;  // end of file: the shim is gone
            return -1;
        }
        auto* ibcq = reinterpret_cast<ibv_cq*>(uintptr_t(handle));
        Context* ctx;
        {
            std::lock_guard lock(r.mu);
            auto it = r.channels.find(channel);
            ctx = it == r.channels.end() ? nullptr : it->second->ctx;
        }
        if (!ctx) {  // its device was closed
            errno = EIO;
            return -1;
        }
        bool live;
        {
            std::lock_guard lock(ctx->ev_mu);
            live = ctx->live_cqs.count(ibcq) != 0;
            if (live) ++to_cq(ibcq)->comp_read;
        }
        if (!live) continue;  // a record of a CQ destroyed since
        *cq = ibcq;
        *cq_context = ibcq->cq_context;
        return 0;
    }
}
