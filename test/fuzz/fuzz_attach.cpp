// libFuzzer target: the attach handshake and the other socket messages
// (AddSegment, RemoveSegment, channels, unknown ops), exactly as the event
// loop feeds them to handle_connection_message: any length, magic, version
// and fields, with 0 to 6 passed fds of every kind (sealed, unsealed, small,
// sparse and write-sealed memfds, eventfds, pipes, sockets, /dev/null, a
// regular file). After an attach the input can also write the control block
// and run the engine. Checked: the shim never accepts memory it could fault
// on (an accepted memfd is sealed against shrinking and large enough).
#include <sys/eventfd.h>
#include <sys/socket.h>

#include "attach.h"
#include "fuzz_common.h"

using namespace vrdma::fuzz;

namespace {

enum Kind : uint8_t {
    kMemfd1M, kUnsealed, kSmall, kSparse1G, kEventfd, kPipeW, kPipeR, kSocket, kDevNull, kRegular,
    kSealableUnsealed, kWriteSealed, kArenaAgain, kKinds
};

bool acceptable_memory(Kind k) { return k == kMemfd1M || k == kSmall || k == kSparse1G || k == kArenaAgain; }

int make_memfd(uint64_t size, bool allow, bool seal_shrink, bool seal_write) {
    return abi_client::make_memfd(size, (seal_shrink ? F_SEAL_SHRINK : 0) | (seal_write ? F_SEAL_WRITE : 0), allow,
                                  "fuzz-seg");
}

struct Conn {
    int peer = -1;  // the guest's end
    std::unique_ptr<Connection> conn;
    Connection& c() { return *conn; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    quiet_logs();
    Engine eng;
    const GuestIdentity& g = eng.add_guest("a", 1, 0x1111);
    Input in(data, size);

    Conn cn;
    uint64_t next_conn = 1;
    auto open_conn = [&] {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
        fcntl(sv[1], F_SETFL, O_NONBLOCK);
        cn.peer = sv[0];
        cn.conn = std::make_unique<Connection>();
        cn.c().id = next_conn++;
        cn.c().guest = &g;
        cn.c().sock.reset(sv[1]);
    };
    auto close_conn = [&] {
        if (cn.c().ctx_id) eng.detach(cn.c().ctx_id);
        cn.c().ctx_id = 0;
        cn.c().sock.reset();
        close(cn.peer);
        cn.peer = -1;
    };
    open_conn();

    int arena_fd = -1;  // the memfd of the current attach (the guest's copy)
    uint8_t* arena = nullptr;
    uint64_t arena_len = 0;
    auto drop_arena = [&] {
        if (arena) munmap(arena, arena_len);
        if (arena_fd >= 0) close(arena_fd);
        arena = nullptr;
        arena_fd = -1;
    };

    for (int steps = 0; !in.empty() && steps < 48; ++steps) {
        uint8_t action = in.u8();
        if (action < 200) {
            // --- one socket message -----------------------------------------
            alignas(8) uint8_t msg[320] = {};
            abi::SockHeader h{abi::kMagic, abi::kVersion, abi::SockOp::Attach, 0};
            uint8_t o = in.u8();
            h.op = abi::SockOp(o < 240 ? 1 + o % 5 : in.u32());
            uint8_t mv = in.u8();
            if (mv == 0xfe) h.magic = in.u32();
            if (mv == 0xff) h.version = in.u32();
            std::memcpy(msg, &h, sizeof(h));
            size_t len;
            switch (h.op) {
            case abi::SockOp::Attach: len = sizeof(abi::SockAttach); break;
            case abi::SockOp::AddSegment: len = sizeof(abi::SockAddSegment); break;
            case abi::SockOp::RemoveSegment: len = sizeof(abi::SockRemoveSegment); break;
            default: len = 24; break;
            }
            uint8_t lv = in.u8();
            if (lv >= 240) len = in.u16() % sizeof(msg);
            // Fields after the header: gva/len/offset/seg_id (or raw).
            uint64_t fields[4];
            for (uint64_t& f : fields) {
                switch (in.pick(10)) {
                case 0: f = 0; break;
                case 1: f = 4096; break;
                case 2: f = 1 << 20; break;
                case 3: f = 1ull << 30; break;
                case 4: f = 1ull << 46; break;
                case 5: f = 0xfffffffffffff000ull; break;
                case 6: f = 0x7f0000000000ull + (uint64_t(in.u16()) << 12); break;
                case 7: f = in.u8(); break;
                case 8: f = (uint64_t(in.u16()) << 12) + (in.u8() & 1 ? 1 : 0); break;
                default: f = in.u64(); break;
                }
            }
            std::memcpy(msg + 16, fields, sizeof(fields));
            if (h.op == abi::SockOp::AddSegment || h.op == abi::SockOp::RemoveSegment ||
                uint32_t(h.op) >= 4) {  // seg_id / channel_id: small, mostly
                uint32_t id = in.u8() < 240 ? in.u8() % 8 : in.u32();
                std::memcpy(msg + (h.op == abi::SockOp::AddSegment ? 40 : 16), &id, 4);
            }
            // Fds.
            uint32_t nfds = in.pick(7);
            int fds[8];
            Kind kinds[8];
            int extra[8];  // other ends to close
            int nextra = 0;
            for (uint32_t i = 0; i < nfds; ++i) {
                Kind k = Kind(in.pick(kKinds));
                if (h.op == abi::SockOp::Attach && i == 0 && in.u8() < 160) k = kMemfd1M;
                if (h.op == abi::SockOp::Attach && (i == 1 || i == 2) && in.u8() < 200) k = kEventfd;
                if (h.op == abi::SockOp::Attach && i == 3 && in.u8() < 200) k = kPipeW;
                kinds[i] = k;
                int fd = -1;
                switch (k) {
                case kMemfd1M: fd = make_memfd(1 << 20, true, true, false); break;
                case kUnsealed: fd = make_memfd(1 << 20, false, false, false); break;
                case kSmall: fd = make_memfd(8192, true, true, false); break;
                case kSparse1G: fd = make_memfd(1ull << 30, true, true, false); break;
                case kEventfd: fd = eventfd(0, EFD_CLOEXEC | (in.u8() & 1 ? EFD_NONBLOCK : 0)); break;
                case kPipeW:
                case kPipeR: {
                    int p[2];
                    if (pipe2(p, O_CLOEXEC) == 0) {
                        fd = k == kPipeW ? p[1] : p[0];
                        extra[nextra++] = k == kPipeW ? p[0] : p[1];
                    }
                    break;
                }
                case kSocket: {
                    int sv[2];
                    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
                        fd = sv[0];
                        extra[nextra++] = sv[1];
                    }
                    break;
                }
                case kDevNull: fd = open("/dev/null", O_RDWR | O_CLOEXEC); break;
                case kRegular: fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
                    if (fd >= 0 && ftruncate(fd, 1 << 20) != 0) {}
                    break;
                case kSealableUnsealed: fd = make_memfd(1 << 20, true, false, false); break;
                case kWriteSealed: fd = make_memfd(1 << 20, true, true, true); break;
                case kArenaAgain: fd = arena_fd >= 0 ? dup(arena_fd) : make_memfd(1 << 20, true, true, false); break;
                case kKinds: break;
                }
                if (fd < 0) fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                fds[i] = fd;
            }
            // Send (up to 6 fds, any length).
            abi_client::send_msg(cn.peer, msg, len, std::span<const int>(fds, nfds), MSG_DONTWAIT);
            const uint64_t before = cn.c().ctx_id;
            bool keep = handle_connection_message(eng, cn.c());
            // The reply (if any) says whether the shim accepted the memory.
            abi::SockReply rep{};
            bool got = recv(cn.peer, &rep, sizeof(rep), MSG_DONTWAIT) == ssize_t(sizeof(rep));
            // The arena holds rings: only a memfd sealed against shrinking
            // will do. A segment added later may be any file (MR memory of
            // every kind: docs/protocol.md "Guest memory"), reached only under
            // the SIGBUS guard, and it must not be able to hold rings.
            if (got && rep.status == 0 && nfds >= 1 && h.op == abi::SockOp::Attach && !before &&
                !acceptable_memory(kinds[0]))
                violation("the shim accepted an arena it could fault on (unsealed, or not a memfd)");
            if (got && rep.status == 0 && nfds >= 1 && h.op == abi::SockOp::AddSegment && !acceptable_memory(kinds[0]) &&
                len >= sizeof(abi::SockAddSegment))
                if (Context* ctx = eng.find_context(cn.c().ctx_id)) {
                    abi::SockAddSegment a;
                    std::memcpy(&a, msg, sizeof(a));
                    HostRange r;
                    // Segments never overlap: an accepted one is its range.
                    if (a.len >= 64 && ctx->segments.translate_ring(a.gva, 64, r) == 0)
                        violation("the shim let memory it could fault on hold rings");
                }
            if (got && rep.status == 0 && nfds >= 1 && acceptable_memory(kinds[0]) && ftruncate(fds[0], 0) == 0)
                violation("an accepted memfd could be shrunk");
            if (!before && cn.c().ctx_id && nfds >= 1) {  // attached: keep the guest's view of the arena
                drop_arena();
                uint64_t alen;
                std::memcpy(&alen, msg + 24, 8);
                arena_fd = fds[0];
                fds[0] = -1;
                if (alen <= (1ull << 30)) {
                    void* p = mmap(nullptr, alen, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0);
                    if (p != MAP_FAILED) {
                        arena = static_cast<uint8_t*>(p);
                        arena_len = alen;
                    }
                }
            }
            for (uint32_t i = 0; i < nfds; ++i)
                if (fds[i] >= 0) close(fds[i]);
            for (int i = 0; i < nextra; ++i) close(extra[i]);
            if (!keep) {
                close_conn();
                drop_arena();
                open_conn();
            }
        } else if (action < 230) {
            // --- the attached guest writes its control block; the engine runs
            if (arena && arena_len >= abi::kControlBlockBytes) {
                auto* cb = reinterpret_cast<abi::ControlBlock*>(arena);
                uint32_t slot = in.u8() % abi::kCmdSlots;
                uint32_t k = in.u8() % 64;
                in.bytes(&cb->cmd[slot], std::min<uint32_t>(k, sizeof(abi::CmdSlot)));
                if (in.u8() & 1) cb->cmd_producer.store(in.u8() < 200 ? cb->cmd_producer.load() + 1 : in.u32());
                cb->doorbell.fetch_add(1);
            }
            eng.poll_once();
            for (uint64_t id : eng.dead_contexts()) {
                eng.detach(id);
                if (id == cn.c().ctx_id) {
                    cn.c().ctx_id = 0;
                    close_conn();
                    drop_arena();
                    open_conn();
                }
            }
        } else {
            // --- the guest hangs up (mid-whatever) and connects again
            close_conn();
            drop_arena();
            open_conn();
        }
    }
    close_conn();
    drop_arena();
    if (eng.context_count() != 0) violation("a context outlived its connection");
    GuestUsage* u = eng.guests().usage_of(g);
    for (unsigned i = 0; i < kResCount; ++i)
        if (u->used(Res(i)) != 0 && Res(i) != Res::Connections) violation("quota charges leaked");
    return 0;
}
