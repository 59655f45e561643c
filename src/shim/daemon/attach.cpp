#include "attach.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <vector>

#include "vrdma/abi.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/log.h"
#include "guest_fd.h"
#include "listen_socket.h"

namespace vrdma::shim {
namespace {

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
                       std::string& error, int type) {
    const std::string name = path.substr(path.rfind('/') + 1);
    UniqueFd fd;
    if (!bind_socket_at(dir_fd, path, name, 0177, 64, fd, error, type)) return false;
    if (!access.apply_socket(dir_fd, name, path, error)) return false;
    out = std::move(fd);
    return true;
}

void refuse_connection(Connection& c, const GuestAccess& access, GuestSecurity& security) {
    ++security.refused_connections;
    unsigned long long more = 0;
    if (security.refusal_log.due(monotonic_ns(), more)) {
        LOG_WARN("guest %s: connection from pid %d uid %u gid %u refused: only %s and root may use this guest "
                 "(%llu more since the last warning)",
                 c.guest->name.c_str(), int(c.pid), unsigned(c.uid), unsigned(c.gid), access.describe().c_str(),
                 more);
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

namespace {

// One message of the socket protocol, its bytes and fds already checked
// against its row of kSockOps. True: keep the connection.
using SockHandler = bool (*)(Engine& eng, Connection& c, Context* ctx, const uint8_t* msg,
                             std::vector<UniqueFd>& fds);

bool on_attach(Engine& eng, Connection& c, Context*, const uint8_t* msg, std::vector<UniqueFd>& fds) {
    abi::SockAttach a;
    std::memcpy(&a, msg, sizeof(a));
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
    if (!ctx) return reply(c, err, 0, "cannot map the arena: %s", why.empty() ? strerror(err) : why.c_str()), false;
    c.ctx_id = ctx->id();
    LOG_INFO("guest %s: pid %d attached (context %llu, arena %llu KiB)", c.guest->name.c_str(), int(c.pid),
             (unsigned long long)ctx->id(), (unsigned long long)(a.arena_len >> 10));
    return reply(c, 0, c.guest->lid, nullptr);
}

bool on_add_segment(Engine&, Connection& c, Context* ctx, const uint8_t* msg, std::vector<UniqueFd>& fds) {
    abi::SockAddSegment s;
    std::memcpy(&s, msg, sizeof(s));
    if (s.seg_id == 0 || ctx->segments.has(s.seg_id)) return reply(c, EEXIST, 0, "segment id %u in use", s.seg_id);
    if (ctx->segments.piece_count() >= 65536) return reply(c, ENOMEM, 0, "too many segments");
    std::shared_ptr<Mapping> map;
    std::string why;
    if (int err = map_segment(std::move(fds[0]), s.gva, s.len, s.offset, map, ctx->charges.usage(), &why))
        return reply(c, err, 0, "cannot map segment %u: %s", s.seg_id, why.empty() ? strerror(err) : why.c_str());
    ctx->segments.insert(s.seg_id, std::move(map));
    return reply(c, 0, 0, nullptr);
}

bool on_remove_segment(Engine&, Connection& c, Context* ctx, const uint8_t* msg, std::vector<UniqueFd>&) {
    abi::SockRemoveSegment s;
    std::memcpy(&s, msg, sizeof(s));
    if (s.seg_id == 0 || !ctx->segments.remove(s.seg_id)) return reply(c, ENOENT, 0, "no segment %u", s.seg_id);
    return reply(c, 0, 0, nullptr);
}

bool on_create_channel(Engine&, Connection& c, Context* ctx, const uint8_t* msg, std::vector<UniqueFd>& fds) {
    abi::SockChannel m;
    std::memcpy(&m, msg, sizeof(m));
    if (!ctx->charges.take(Res::Fds, 1, "CreateChannel"))
        return reply(c, ENOMEM, 0, "the guest holds its quota of file descriptors (--quota fds)");
    if (int err = ctx->add_channel(m.channel_id, std::move(fds[0]))) {
        ctx->charges.give(Res::Fds, 1);
        return reply(c, err, 0, "cannot add completion channel %u: %s", m.channel_id,
                     err == EINVAL ? "id 0 or not the write end of a pipe" : strerror(err));
    }
    return reply(c, 0, 0, nullptr);
}

bool on_destroy_channel(Engine&, Connection& c, Context* ctx, const uint8_t* msg, std::vector<UniqueFd>&) {
    abi::SockChannel m;
    std::memcpy(&m, msg, sizeof(m));
    if (!ctx->remove_channel(m.channel_id)) return reply(c, ENOENT, 0, "no completion channel %u", m.channel_id);
    ctx->charges.give(Res::Fds, 1);
    return reply(c, 0, 0, nullptr);
}

// The socket protocol (abi::SockOp), one row per operation in the enum's
// order: a message must have exactly `bytes` bytes and `fds` descriptors.
struct SockOpSpec {
    abi::SockOp op;
    const char* name;
    size_t bytes;
    size_t fds;
    bool needs_context;     // the connection must have attached first (or, if false, must not have)
    bool malformed_closes;  // a wrong size or fd count ends the connection
    SockHandler handle;
};
constexpr SockOpSpec kSockOps[] = {
    {abi::SockOp::Attach, "Attach", sizeof(abi::SockAttach), 4, false, true, on_attach},
    {abi::SockOp::AddSegment, "AddSegment", sizeof(abi::SockAddSegment), 1, true, false, on_add_segment},
    {abi::SockOp::RemoveSegment, "RemoveSegment", sizeof(abi::SockRemoveSegment), 0, true, false, on_remove_segment},
    {abi::SockOp::CreateChannel, "CreateChannel", sizeof(abi::SockChannel), 1, true, false, on_create_channel},
    {abi::SockOp::DestroyChannel, "DestroyChannel", sizeof(abi::SockChannel), 0, true, false, on_destroy_channel},
};
constexpr bool sock_ops_in_order() {
    for (size_t i = 0; i < std::size(kSockOps); ++i)
        if (uint32_t(kSockOps[i].op) != i + 1) return false;
    return true;
}
static_assert(sock_ops_in_order(), "kSockOps: one row per abi::SockOp, in order from 1");

}  // namespace

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
    const uint32_t op = uint32_t(hdr.op);
    if (op == 0 || op > std::size(kSockOps)) return reply(c, EINVAL, 0, "unknown operation %u", op);
    const SockOpSpec& spec = kSockOps[op - 1];
    Context* ctx = nullptr;
    if (spec.needs_context && !(ctx = eng.find_context(c.ctx_id))) return reply(c, EINVAL, 0, "not attached"), false;
    if (!spec.needs_context && c.ctx_id) return reply(c, EBUSY, 0, "already attached");
    if (size_t(n) != spec.bytes || fds.size() != spec.fds) {
        const bool keep = reply(c, EINVAL, 0, "%s needs %zu bytes and %zu fd%s", spec.name, spec.bytes, spec.fds,
                                spec.fds == 1 ? "" : "s");
        return keep && !spec.malformed_closes;
    }
    return spec.handle(eng, c, ctx, buf, fds);
}

}  // namespace vrdma::shim
