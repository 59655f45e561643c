// Control path to the shim: command slots in the shared control block and
// requests on the UNIX socket (protocol.md "Commands", "Attach").
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "context.h"
#include "events.h"
#include "queue_lock.h"  // cpu_relax
#include "vrdma/ring.h"
#include "vrdma/vm_abi.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/log.h"

namespace vrdma::prov {
namespace {

// True if the socket says the shim went away (hangup, error or EOF).
bool shim_gone(Context& ctx, short revents) {
    if (revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    if (revents & POLLIN) {
        char b;
        ssize_t n = ::recv(ctx.sock.get(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return true;
        if (n > 0) {
            // Nothing is expected here outside a request; drop it.
            std::vector<UniqueFd> fds;
            char junk[256];
            recv_with_fds(ctx.sock.get(), junk, sizeof(junk), fds);
        }
    }
    return false;
}

}  // namespace

void ring_vm_doorbell(Context& ctx) {
    auto* doorbell = reinterpret_cast<volatile uint32_t*>(static_cast<uint8_t*>(ctx.vm_regs) + abi::kIvshmemDoorbell);
    *doorbell = (uint32_t(abi::kVmShimPeer) << 16) | abi::kVmVectorKick;
}

const char* shim_state_reason(uint32_t state) {
    return state == abi::kGuestRemoved ? "the operator removed this guest (vrdmactl guest remove)"
                                       : "the shim reported a fatal error";
}

bool shim_lost(Context& ctx) {
    if (ctx.dead.load(std::memory_order_relaxed)) return true;
    if (uint32_t state = ctx.cb->shim_state.load(std::memory_order_acquire); state != abi::kShimRunning) {
        mark_dead(ctx, shim_state_reason(state));
        return true;
    }
    // POLLRDHUP alone: data waiting on the socket does not count.
    pollfd p{ctx.sock.get(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL))) {
        mark_dead(ctx, "the shim closed the socket");
        return true;
    }
    return false;
}

void mark_dead(Context& ctx, const char* why) {
    if (!ctx.dead.exchange(true))
        LOG_ERR("connection to the vrdma shim (%s) lost: %s; device unusable",
                ctx.socket_path.c_str(), why);
}

int command(Context& ctx, abi::CmdOp op, const void* req, size_t req_len, void* resp,
            size_t resp_len) {
    if (req_len > abi::kCmdReqBytes || resp_len > abi::kCmdRespBytes) return EINVAL;
    std::lock_guard lock(ctx.cmd_mu);
    if (ctx.dead.load(std::memory_order_relaxed)) return EIO;
    abi::ControlBlock* cb = ctx.cb;
    abi::CmdSlot& slot = cb->cmd[ring_slot(ctx.cmd_prod, abi::kCmdSlots)];
    uint32_t seq = ++ctx.cmd_seq;
    if (seq == 0) seq = ++ctx.cmd_seq;  // never 0 (a fresh slot's done_seq)
    slot.op = op;
    slot.status = 0;
    std::memset(slot.req, 0, sizeof(slot.req));
    if (req_len) std::memcpy(slot.req, req, req_len);
    slot.seq.store(seq, std::memory_order_release);
    ctx.cmd_prod = ring_next(ctx.cmd_prod, abi::kCmdSlots);
    cb->cmd_producer.store(ctx.cmd_prod, std::memory_order_release);
    ring_doorbell(ctx);

    auto done = [&] { return slot.done_seq.load(std::memory_order_acquire) == seq; };
    for (int i = 0; i < 2000 && !done(); ++i) cpu_relax();
    while (!done()) {
        if (uint32_t state = cb->shim_state.load(std::memory_order_acquire); state != abi::kShimRunning) {
            mark_dead(ctx, shim_state_reason(state));
            return EIO;
        }
        pollfd pfd[2] = {{ctx.cmd_done.get(), POLLIN, 0}, {ctx.sock.get(), POLLIN, 0}};
        // In a VM nothing rings cmd_done: the slot is looked at every
        // millisecond instead.
        int n = ::poll(pfd, 2, ctx.in_vm ? 1 : 100);
        if (n < 0 && errno != EINTR) {
            mark_dead(ctx, std::strerror(errno));
            return EIO;
        }
        if (n > 0 && (pfd[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t r = ::read(ctx.cmd_done.get(), &v, sizeof(v));
            (void)r;
        }
        if (done()) break;
        if (n > 0 && pfd[1].revents && shim_gone(ctx, pfd[1].revents)) {
            mark_dead(ctx, "the shim closed the socket");
            return EIO;
        }
    }
    int status = slot.status;
    if (status < 0) status = EIO;
    if (status == 0 && resp && resp_len) std::memcpy(resp, slot.resp, resp_len);
    return status;
}

int sock_request(Context& ctx, const void* msg, size_t len, std::span<const int> fds,
                 abi::SockReply* reply, std::vector<UniqueFd>* reply_fds) {
    std::lock_guard lock(ctx.cmd_mu);
    if (ctx.dead.load(std::memory_order_relaxed)) return EIO;
    int rc = send_with_fds(ctx.sock.get(), msg, len, fds);
    if (rc) {
        mark_dead(ctx, std::strerror(rc));
        return EIO;
    }
    for (;;) {
        std::vector<UniqueFd> got;
        long n = recv_with_fds(ctx.sock.get(), reply, sizeof(*reply), got);
        if (n == 0) {
            mark_dead(ctx, "the shim closed the socket");
            return EIO;
        }
        if (n < 0) {
            mark_dead(ctx, std::strerror(int(-n)));
            return EIO;
        }
        if (size_t(n) != sizeof(*reply) || reply->magic != abi::kMagic) {
            mark_dead(ctx, "malformed reply from the shim");
            return EIO;
        }
        reply->message[sizeof(reply->message) - 1] = 0;
        if (reply_fds) *reply_fds = std::move(got);
        return reply->status < 0 ? EIO : reply->status;
    }
}

}  // namespace vrdma::prov
