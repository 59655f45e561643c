#include "attach.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

#include "vrdma/abi.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/log.h"
#include "listen_socket.h"

namespace vrdma::shim {
namespace {

bool is_eventfd(int fd) {
    char path[64], target[64] = {};
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = ::readlink(path, target, sizeof(target) - 1);
    return n > 0 && std::strcmp(target, "anon_inode:[eventfd]") == 0;
}

[[gnu::format(printf, 4, 5)]] bool reply(Connection& c, int status, uint32_t lid, const char* fmt, ...) {
    abi::SockReply r{};
    r.magic = abi::kMagic;
    r.status = status;
    r.guest_lid = lid;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        std::vsnprintf(r.message, sizeof(r.message), fmt, ap);
        va_end(ap);
        if (status)
            LOG_INFO("guest %s: connection %llu (pid %d): %s", c.guest->name.c_str(), (unsigned long long)c.id,
                     int(c.pid), r.message);
    }
    ssize_t n = ::send(c.sock.get(), &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL);
    return n == ssize_t(sizeof(r));
}

}  // namespace

bool open_guest_socket(int dir_fd, const std::string& path, const GuestAccess& access, UniqueFd& out,
                       std::string& error) {
    const std::string name = path.substr(path.rfind('/') + 1);
    UniqueFd fd;
    if (!bind_socket_at(dir_fd, path, name, 0177, 64, fd, error)) return false;
    if (!access.apply_socket(dir_fd, name, path, error)) return false;
    out = std::move(fd);
    return true;
}

void refuse_connection(Connection& c, const GuestAccess& access, GuestSecurity& security) {
    ++security.refused_connections;
    if (security.refusal_log.due(monotonic_ns())) {
        LOG_WARN("guest %s: connection from pid %d uid %u gid %u refused: only %s and root may use this guest "
                 "(%llu more since the last warning)",
                 c.guest->name.c_str(), int(c.pid), unsigned(c.uid), unsigned(c.gid), access.describe().c_str(),
                 (unsigned long long)security.refusal_log.unlogged);
        security.refusal_log.unlogged = 0;
    }
    abi::SockReply r{};
    r.magic = abi::kMagic;
    r.status = EACCES;
    std::snprintf(r.message, sizeof(r.message), "access refused: uid %u may not use guest %s (owner: %s)",
                  unsigned(c.uid), c.guest->name.c_str(), access.describe().c_str());
    (void)::send(c.sock.get(), &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void read_peer_credentials(Connection& c) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(c.sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        c.pid = cred.pid;
        c.uid = cred.uid;
        c.gid = cred.gid;
    }
    LOG_INFO("guest %s: connection %llu from pid %d uid %u", c.guest->name.c_str(), (unsigned long long)c.id,
             int(c.pid), unsigned(c.uid));
}

bool handle_connection_message(Engine& eng, Connection& c) {
    alignas(8) uint8_t buf[256];
    std::vector<UniqueFd> fds;
    long n = recv_with_fds(c.sock.get(), buf, sizeof(buf), fds);
    if (n == -EAGAIN || n == -EWOULDBLOCK) return true;
    if (n == 0) return false;
    if (n < 0) {
        LOG_INFO("guest %s: connection %llu: %s", c.guest->name.c_str(), (unsigned long long)c.id, strerror(int(-n)));
        return false;
    }
    abi::SockHeader hdr;
    if (size_t(n) < sizeof(hdr)) return reply(c, EINVAL, 0, "message too short"), false;
    std::memcpy(&hdr, buf, sizeof(hdr));
    if (hdr.magic != abi::kMagic || hdr.version != abi::kVersion)
        return reply(c, EPROTO, 0, "bad magic or ABI version %u (shim speaks %u)", hdr.version, abi::kVersion), false;

    switch (hdr.op) {
    case abi::SockOp::Attach: {
        if (c.ctx_id) return reply(c, EBUSY, 0, "already attached");
        abi::SockAttach a;
        if (size_t(n) != sizeof(a) || fds.size() != 4)
            return reply(c, EINVAL, 0, "Attach needs %zu bytes and 4 fds", sizeof(a)), false;
        std::memcpy(&a, buf, sizeof(a));
        if (!is_eventfd(fds[1].get()) || !is_eventfd(fds[2].get()))
            return reply(c, EINVAL, 0, "kick and cmd-done fds must be eventfds"), false;
        // The shim writes async event records into fds[3]: only a pipe or a
        // socket (a file could live on a file system the guest serves, where
        // a write may block whatever O_NONBLOCK says).
        struct stat ast;
        if (::fstat(fds[3].get(), &ast) != 0 || !(S_ISFIFO(ast.st_mode) || S_ISSOCK(ast.st_mode)))
            return reply(c, EINVAL, 0, "the async event fd must be a pipe or a socket"), false;
        // The context's kick and cmd-done eventfds and async pipe (the
        // connection's own socket is charged at accept).
        if (!c.charges.take(Res::Fds, 3, "Attach"))
            return reply(c, ENOMEM, 0, "the guest holds its quota of file descriptors (--quota fds)"), false;
        int err = 0;
        std::string why;
        Context* ctx = eng.attach(*c.guest, std::move(fds[0]), a.arena_gva, a.arena_len, std::move(fds[1]),
                                  std::move(fds[2]), std::move(fds[3]), err, &why);
        if (!ctx)
            return reply(c, err, 0, "cannot map the arena: %s", why.empty() ? strerror(err) : why.c_str()), false;
        c.ctx_id = ctx->id();
        LOG_INFO("guest %s: pid %d attached (context %llu, arena %llu KiB)", c.guest->name.c_str(), int(c.pid),
                 (unsigned long long)ctx->id(), (unsigned long long)(a.arena_len >> 10));
        return reply(c, 0, c.guest->lid, nullptr);
    }
    case abi::SockOp::AddSegment: {
        Context* ctx = eng.find_context(c.ctx_id);
        if (!ctx) return reply(c, EINVAL, 0, "not attached"), false;
        abi::SockAddSegment s;
        if (size_t(n) != sizeof(s) || fds.size() != 1)
            return reply(c, EINVAL, 0, "AddSegment needs %zu bytes and 1 fd", sizeof(s));
        std::memcpy(&s, buf, sizeof(s));
        if (s.seg_id == 0 || ctx->segments.has(s.seg_id)) return reply(c, EEXIST, 0, "segment id %u in use", s.seg_id);
        if (ctx->segments.piece_count() >= 65536) return reply(c, ENOMEM, 0, "too many segments");
        std::shared_ptr<Mapping> map;
        std::string why;
        if (int err = map_segment(std::move(fds[0]), s.gva, s.len, s.offset, map, ctx->charges.usage(), &why))
            return reply(c, err, 0, "cannot map segment %u: %s", s.seg_id, why.empty() ? strerror(err) : why.c_str());
        ctx->segments.insert(s.seg_id, std::move(map));
        return reply(c, 0, 0, nullptr);
    }
    case abi::SockOp::RemoveSegment: {
        Context* ctx = eng.find_context(c.ctx_id);
        if (!ctx) return reply(c, EINVAL, 0, "not attached"), false;
        abi::SockRemoveSegment s;
        if (size_t(n) != sizeof(s) || !fds.empty())
            return reply(c, EINVAL, 0, "RemoveSegment needs %zu bytes and no fd", sizeof(s));
        std::memcpy(&s, buf, sizeof(s));
        if (s.seg_id == 0 || !ctx->segments.remove(s.seg_id))
            return reply(c, ENOENT, 0, "no segment %u", s.seg_id);
        return reply(c, 0, 0, nullptr);
    }
    case abi::SockOp::CreateChannel: {
        Context* ctx = eng.find_context(c.ctx_id);
        if (!ctx) return reply(c, EINVAL, 0, "not attached"), false;
        abi::SockChannel m;
        if (size_t(n) != sizeof(m) || fds.size() != 1)
            return reply(c, EINVAL, 0, "CreateChannel needs %zu bytes and 1 fd", sizeof(m));
        std::memcpy(&m, buf, sizeof(m));
        if (!ctx->charges.take(Res::Fds, 1, "CreateChannel"))
            return reply(c, ENOMEM, 0, "the guest holds its quota of file descriptors (--quota fds)");
        if (int err = ctx->add_channel(m.channel_id, std::move(fds[0]))) {
            ctx->charges.give(Res::Fds, 1);
            return reply(c, err, 0, "cannot add completion channel %u: %s", m.channel_id,
                         err == EINVAL ? "id 0 or not the write end of a pipe" : strerror(err));
        }
        return reply(c, 0, 0, nullptr);
    }
    case abi::SockOp::DestroyChannel: {
        Context* ctx = eng.find_context(c.ctx_id);
        if (!ctx) return reply(c, EINVAL, 0, "not attached"), false;
        abi::SockChannel m;
        if (size_t(n) != sizeof(m) || !fds.empty())
            return reply(c, EINVAL, 0, "DestroyChannel needs %zu bytes and no fd", sizeof(m));
        std::memcpy(&m, buf, sizeof(m));
        if (!ctx->remove_channel(m.channel_id)) return reply(c, ENOENT, 0, "no completion channel %u", m.channel_id);
        ctx->charges.give(Res::Fds, 1);
        return reply(c, 0, 0, nullptr);
    }
    }
    return reply(c, EINVAL, 0, "unknown operation %u", uint32_t(hdr.op));
}

}  // namespace vrdma::shim
