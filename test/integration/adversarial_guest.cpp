// A hostile guest (docs/reliability.md "Adversarial guest"). It attaches to
// its shim like the provider does, through the device ABI directly (a sealed
// memfd arena, its own eventfds and async pipe), and then does everything a
// guest controls wrong: malformed socket messages and fds, command-ring and
// work-queue indices past the ring or stale, huge and zero sizes and counts,
// SGEs outside every segment or wrapping, guessed handles, keys and QPNs of
// other guests, commands before setup and racing with destroy, WQEs and
// command slots rewritten while the shim reads them, saturated eventfds,
// O_NONBLOCK cleared on the fds the shim writes, a full async pipe, memfd
// truncation and hole punching, connection floods.
//
// Run under vrdma-run (it reads SYSFS_PATH to find its socket). It never
// waits for the shim for ever. Exit status: 0 when the shim still answers a
// fresh, well-formed attach and command at the end (and answered within
// bounds throughout), 1 otherwise. It prints one line per case.
//
//   adversarial_guest [--seconds N] [--seed S]
// and the single cases of other scripts (main() lists them).
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/falloc.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "abi_client.h"
#include "vrdma/abi.h"

namespace abi = vrdma::abi;
namespace abi_client = vrdma::abi_client;
using abi_client::await_reply;
using abi_client::now_ms;

namespace {

std::mt19937_64 rng;
std::string g_socket;
int g_failures = 0;

[[gnu::format(printf, 1, 2)]] void say(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vprintf(fmt, ap);
    va_end(ap);
    std::printf("\n");
    std::fflush(stdout);
}

[[gnu::format(printf, 1, 2)]] void bad(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::printf("UNEXPECTED: ");
    std::vprintf(fmt, ap);
    va_end(ap);
    std::printf("\n");
    std::fflush(stdout);
    ++g_failures;
}

uint32_t r32() { return uint32_t(rng()); }
uint64_t r64() { return rng(); }
uint32_t pick(uint32_t n) { return uint32_t(rng() % n); }

// A value that is likely to hurt: 0, 1, powers of two and their neighbours,
// all ones, random.
uint64_t nasty64() {
    switch (pick(8)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return uint64_t(1) << pick(64);
    case 3: return (uint64_t(1) << pick(64)) - 1;
    case 4: return ~uint64_t(0) - pick(16);
    case 5: return pick(1 << 16);
    default: return r64();
    }
}
uint32_t nasty32() { return uint32_t(nasty64() >> (pick(2) ? 0 : 32)); }

int make_memfd(uint64_t size, bool seal) { return abi_client::make_memfd(size, seal ? F_SEAL_SHRINK : 0, true, "adversary"); }
int connect_socket() { return abi_client::connect_socket(g_socket); }
int send_msg(int sock, const void* buf, size_t len, const std::vector<int>& fds) {
    return abi_client::send_msg(sock, buf, len, std::span<const int>(fds));
}

// One connection as the provider makes it (the shared ABI client), with
// results a case can count: handles are 0 when the shim refused.
class Guest : public abi_client::ShimConnection {
public:
    static constexpr uint64_t kArena = 4 << 20;
    using Cq = abi_client::CqView;
    using Qp = abi_client::QpView;

    Guest() { arena().wrap_when_full = true; }  // the adversary does not care

    // 0 on success, else the shim's status (or -1/-2 as await_reply).
    int attach(bool seal = true) { return ShimConnection::attach(g_socket, kArena, seal); }
    int arena_fd() { return arena().fd(); }
    uint64_t alloc(uint64_t bytes, uint64_t align = 4096) { return Client::alloc(bytes, align); }

    // Issues one command. Returns its status, -1 when the shim hung up, -2
    // when it did not answer within 3 s.
    int cmd(abi::CmdOp op, const void* req, size_t len, void* resp = nullptr, size_t resp_len = 0) {
        auto r = cmd_raw(uint32_t(op), req, len);
        if (resp && r.done()) std::memcpy(resp, r.resp, std::min(resp_len, sizeof(r.resp)));
        return r.status;
    }
    template <typename Req>
    int cmd(abi::CmdOp op, const Req& req, void* resp = nullptr, size_t resp_len = 0) {
        return cmd(op, &req, sizeof(req), resp, resp_len);
    }

    // --- resources ---
    uint32_t pd() {
        uint32_t h = 0;
        return alloc_pd(h) == 0 ? h : 0;
    }
    abi::CmdRegMrResp mr(uint32_t pd, uint64_t addr, uint64_t len, uint32_t access) {
        abi_client::MrInfo m;
        if (reg_mr(pd, addr, len, access, m) != 0) return {};
        return abi::CmdRegMrResp{m.handle, m.lkey, m.rkey};
    }
    Cq cq(uint32_t entries) {
        Cq c;
        create_cq(entries, c);
        return c;
    }
    // 8 entries of 512 bytes in each queue, all signaled.
    Qp qp(uint32_t pd, uint32_t cq, uint32_t type) {
        abi_client::QpSpec s;
        s.type = type;
        s.entries = 8;
        s.stride = s.rq_stride = 512;
        s.sig_all = 1;
        s.user_handle = 0;
        Qp q;
        create_qp(pd, cq, cq, s, q);
        return q;
    }
    int modify(uint32_t qp, uint32_t mask, const abi::QpAttr& a) { return modify_qp(qp, mask, a); }
    // RESET -> RTS, RC to (dlid, dqpn) or UD.
    int connect(const Qp& q, uint16_t dlid, uint32_t dqpn) {
        if (q.type == IBV_QPT_UD) return connect_ud(q.handle, 0x11111111);
        abi_client::RcPath p;
        p.dlid = dlid;
        p.dqpn = dqpn;
        return connect_rc(q.handle, p);
    }
};

// The end-of-case check: a fresh, well-formed guest attaches and gets an
// answer to QueryDevice within a second.
bool shim_answers(const char* after) {
    Guest g;
    int st = g.attach();
    abi::DeviceAttr attr{};
    int c = st == 0 ? g.cmd(abi::CmdOp::QueryDevice, nullptr, 0, &attr, sizeof(attr)) : st;
    if (st != 0 || c != 0 || attr.phys_port_cnt != 1) {
        bad("after %s: a well-formed guest got attach %d, QueryDevice %d", after, st, c);
        return false;
    }
    return true;
}

// A guest with a PD, a 64 KiB MR, a CQ and RC (loopback) and UD QPs in RTS.
struct Armed {
    Guest g;
    uint32_t pd = 0;
    abi::CmdRegMrResp mr{};
    uint64_t buf = 0;
    Guest::Cq cq;
    Guest::Qp rc, ud;
    bool ok = false;
    Armed() {
        if (g.attach() != 0) return;
        pd = g.pd();
        buf = g.alloc(64 << 10);
        mr = g.mr(pd, buf, 64 << 10, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        cq = g.cq(64);
        rc = g.qp(pd, cq.handle, IBV_QPT_RC);
        ud = g.qp(pd, cq.handle, IBV_QPT_UD);
        ok = pd && mr.lkey && cq.handle && rc.handle && ud.handle && g.connect(rc, uint16_t(g.lid()), rc.qpn) == 0 &&
             g.connect(ud, 0, 0) == 0;
    }
    // A random but plausible send WQE (any opcode, SGEs/inline, keys).
    void random_send(Guest::Qp& q) {
        abi::SendWqe w{};
        w.wr_id = r64();
        static constexpr uint32_t kOps[] = {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
                                            IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ,
                                            IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD};
        w.opcode = pick(10) ? kOps[pick(7)] : nasty32();
        w.send_flags = pick(4) ? IBV_SEND_SIGNALED | (pick(3) ? 0 : IBV_SEND_INLINE) : nasty32();
        w.num_sge = pick(3) ? pick(5) : nasty32();
        w.inline_len = pick(3) ? pick(400) : nasty32();
        w.remote_addr = pick(2) ? buf + pick(70000) - 2000 : nasty64();
        w.rkey = pick(2) ? mr.rkey : guess_key();
        w.ah_handle = pick(2) ? nasty32() : 0x60000000u | pick(64);
        w.remote_qpn = pick(2) ? pick(400) : nasty32();
        w.remote_qkey = pick(2) ? 0x11111111 : nasty32();
        // SGEs fill the slot, whatever num_sge says.
        std::vector<abi::Sge> sges((q.sq.stride - sizeof(w)) / sizeof(abi::Sge));
        for (abi::Sge& sge : sges) {
            sge.addr = pick(2) ? buf + pick(70000) - 2000 : nasty64();
            sge.length = pick(2) ? pick(8192) : nasty32();
            sge.lkey = pick(2) ? mr.lkey : guess_key();
        }
        g.post_send(q.sq, w, sges);
    }
    // Keys of other guests: 32 random bits each (KeyTable), so a guess is
    // the old guessable form (an MR handle: small slot and generation) or
    // any number.
    static uint32_t guess_key() {
        return pick(4) ? (2u << 29) | (pick(4) << 21) | (1 + pick(64)) : pick(2) ? uint32_t(rng()) : nasty32();
    }
};

// --- socket messages -------------------------------------------------------

void case_socket_garbage() {
    int answered = 0, hung = 0;
    for (int i = 0; i < 200; ++i) {
        int s = connect_socket();
        if (s < 0) {
            bad("cannot connect (iteration %d)", i);
            return;
        }
        uint8_t msg[512];
        for (auto& b : msg) b = uint8_t(r32());
        abi::SockHeader h{pick(4) ? abi::kMagic : r32(), pick(4) ? abi::kVersion : r32(),
                          abi::SockOp(pick(4) ? 1 + pick(6) : r32()), r32()};
        std::memcpy(msg, &h, sizeof(h));
        size_t len = pick(3) ? pick(64) : 1 + pick(sizeof(msg) - 1);  // 0..63, or up to 512 (truncated)
        std::vector<int> fds;
        uint32_t nfd = pick(3) ? pick(5) : pick(14);
        for (uint32_t k = 0; k < nfd; ++k) {
            switch (pick(5)) {
            case 0: fds.push_back(make_memfd(4096 * (1 + pick(4)), pick(2))); break;
            case 1: fds.push_back(eventfd(0, EFD_CLOEXEC)); break;
            case 2: {
                int p[2];
                if (pipe2(p, O_CLOEXEC) != 0) break;
                fds.push_back(p[pick(2)]);
                ::close(p[0] == fds.back() ? p[1] : p[0]);
                break;
            }
            case 3: fds.push_back(::open("/dev/null", O_RDWR | O_CLOEXEC)); break;
            default: fds.push_back(connect_socket()); break;
            }
        }
        send_msg(s, msg, len ? len : 1, fds);
        for (int f : fds) ::close(f);
        int st = await_reply(s, 3000);
        if (st == -2) bad("no answer to a malformed message within 3 s");
        (st == -1 ? hung : answered)++;
        ::close(s);
    }
    say("socket garbage: 200 malformed messages (bad magic/version/op/length, 0-13 fds of every kind): "
        "%d answered with an error, %d hung up",
        answered, hung);
}

void case_attach_refusals() {
    // Each builds its own Attach message.
    auto attempt = [](const char* what, uint64_t gva, uint64_t len, bool seal, int kick_kind, int async_kind,
                      int nfds) {
        int s = connect_socket();
        int mem = make_memfd(1 << 20, seal);
        int ev1 = kick_kind == 0 ? eventfd(0, EFD_CLOEXEC) : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        int ev2 = eventfd(0, EFD_CLOEXEC);
        int p[2] = {-1, -1};
        (void)!pipe2(p, O_CLOEXEC);
        int tmp = -1;
        if (async_kind == 1) {
            char path[] = "/tmp/vrdma-adversary.XXXXXX";
            tmp = mkstemp(path);
            unlink(path);
        }
        abi::SockAttach a = abi_client::attach_msg(gva, len);
        std::vector<int> fds = {mem, ev1, ev2, async_kind == 1 ? tmp : p[1], ev2, ev2};
        fds.resize(size_t(nfds));
        send_msg(s, &a, sizeof(a), fds);
        int st = await_reply(s, 3000);
        for (int f : {s, mem, ev1, ev2, p[0], p[1], tmp})
            if (f >= 0) ::close(f);
        if (st == 0 || st == -2) bad("attach %s: got %d, wanted a refusal", what, st);
        return st;
    };
    attempt("with an unsealed memfd", 0x10000000, 1 << 20, false, 0, 0, 4);
    attempt("longer than the memfd", 0x10000000, 2 << 20, true, 0, 0, 4);
    attempt("of length 0", 0x10000000, 0, true, 0, 0, 4);
    attempt("of 4 KiB (< control block)", 0x10000000, 4096, true, 0, 0, 4);
    attempt("at gva 0", 0, 1 << 20, true, 0, 0, 4);
    attempt("at an unaligned gva", 0x10000010, 1 << 20, true, 0, 0, 4);
    attempt("wrapping the address space", 0xfffffffffff00000ull, 1 << 20, true, 0, 0, 4);
    attempt("with /dev/null as kick eventfd", 0x10000000, 1 << 20, true, 1, 0, 4);
    attempt("with a regular file as async fd", 0x10000000, 1 << 20, true, 0, 1, 4);
    attempt("with 3 fds", 0x10000000, 1 << 20, true, 0, 0, 3);
    attempt("with 6 fds", 0x10000000, 1 << 20, true, 0, 0, 6);
    attempt("with no fd", 0x10000000, 1 << 20, true, 0, 0, 0);
    // Attach twice on one connection; segment operations before attach.
    Guest g;
    if (g.attach() != 0) return bad("a well-formed attach failed");
    abi::SockAttach a = abi_client::attach_msg(0, 0);
    send_msg(g.sock(), &a, sizeof(a), {});
    if (await_reply(g.sock(), 3000) != EBUSY) bad("a second Attach on one connection was not refused with EBUSY");
    int s = connect_socket();
    abi::SockAddSegment seg = abi_client::add_segment_msg(0x20000000, 1 << 20, 0, 1);
    int mem = make_memfd(1 << 20, true);
    send_msg(s, &seg, sizeof(seg), {mem});
    if (int st = await_reply(s, 3000); st == 0 || st == -2) bad("AddSegment before Attach: %d", st);
    ::close(s);
    ::close(mem);
    say("attach refusals: unsealed/short/empty/unaligned/wrapping arenas, wrong fd kinds and counts, double "
        "attach, AddSegment before attach: all refused");
}

void case_segments() {
    Guest g;
    if (g.attach() != 0) return bad("attach failed");
    int refused = 0, accepted = 0;
    for (int i = 0; i < 300; ++i) {
        abi::SockAddSegment s = abi_client::add_segment_msg(0, 0, 0, 0);
        uint64_t file = 4096 * (1 + pick(64));
        int fd = make_memfd(file, pick(8) != 0);
        s.gva = pick(2) ? (0x30000000ull + pick(256) * 4096) : nasty64();  // overlapping each other, or nasty
        s.len = pick(2) ? 4096 * (1 + pick(64)) : nasty64();
        s.offset = pick(2) ? 4096 * pick(4) : nasty64();
        s.seg_id = pick(4) ? 1 + pick(40) : nasty32();
        send_msg(g.sock(), &s, sizeof(s), {fd});
        if (pick(2)) (void)!ftruncate(fd, 0);  // shrink after sending: must fail once sealed
        ::close(fd);
        int st = await_reply(g.sock(), 3000);
        if (st == -2 || st == -1) return bad("AddSegment %d: shim %s", i, st == -1 ? "hung up" : "silent");
        (st == 0 ? accepted : refused)++;
        if (pick(3) == 0) {
            abi::SockRemoveSegment rm = abi_client::remove_segment_msg(pick(2) ? pick(42) : r32());
            send_msg(g.sock(), &rm, sizeof(rm), {});
            if (await_reply(g.sock(), 3000) < -1) return bad("RemoveSegment: no answer");
        }
    }
    // The arena cannot be shrunk under the shim's mapping; holes read as 0.
    if (ftruncate(g.arena_fd(), 4096) == 0) bad("the sealed arena memfd could be shrunk");
    (void)!fallocate(g.arena_fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, Guest::kArena);
    int st = g.cmd(abi::CmdOp::AllocPd, nullptr, 0);
    // Channels: an eventfd, the read end, a duplicate id, then too many.
    int chan_ok = 0;
    for (int i = 0; i < 1100; ++i) {
        abi::SockChannel m = abi_client::create_channel_msg(i < 3 ? 7 : uint32_t(i));
        int p[2] = {-1, -1};
        (void)!pipe2(p, O_CLOEXEC);
        int fd = i == 0 ? eventfd(0, EFD_CLOEXEC) : i == 1 ? p[0] : p[1];
        send_msg(g.sock(), &m, sizeof(m), {fd});
        ::close(p[0]);
        ::close(p[1]);
        if (i == 0) ::close(fd);
        int r = await_reply(g.sock(), 3000);
        if (r < -1) return bad("CreateChannel: no answer");
        if (r == 0) ++chan_ok;
    }
    say("segments: 300 AddSegment (unsealed, overlapping, nasty gva/len/offset/id, shrunk after sending) "
        "%d accepted %d refused; arena shrink refused, holes punched in the whole arena (command after it: %d); "
        "1100 CreateChannel: %d accepted (limit 1024)",
        accepted, refused, st, chan_ok);
}

void case_connection_flood() {
    // The connection quota is per guest: while this guest holds 400 open
    // sockets its own new attaches are refused (the other guests, checked
    // by adversarial.sh, are not affected); once it closes them it is
    // served again.
    std::vector<int> socks;
    for (int i = 0; i < 400; ++i) {
        int s = connect_socket();
        if (s < 0) break;
        socks.push_back(s);
    }
    usleep(100000);
    Guest g;
    int while_flooding = g.attach();
    // The flood connections the shim refused are closed at its end (the
    // shim takes connections in order, so by the time it answered the
    // attach it has taken them all). The attach may be served only while
    // fewer than 256 are held: a connection of an earlier case, closed just
    // before the flood, may still have been counted when the flood came
    // and freed its place only after.
    int held = 0;
    for (int s : socks) {
        pollfd p{s, POLLIN | POLLRDHUP, 0};
        if (::poll(&p, 1, 0) == 0 || !(p.revents & (POLLHUP | POLLRDHUP))) ++held;
    }
    g.close_all();
    for (int s : socks) ::close(s);
    usleep(100000);
    say("connection flood: %zu connections opened without attaching (quota 256), %d of them held: attach "
        "meanwhile %d (refused: -1), served again after closing them",
        socks.size(), held, while_flooding);
    if (while_flooding == 0 && held >= 256) bad("a 257th connection of one guest was served");
    if (held > 256) bad("%d connections of one guest were held (quota 256)", held);
}

// --- command ring ----------------------------------------------------------

void case_command_indices() {
    int detached = 0;
    for (uint32_t bad_prod : {17u, 32u, 1000u, 0xffffffffu, 0x80000000u}) {
        Guest g;
        if (g.attach() != 0) return bad("attach failed");
        g.cb()->cmd_producer.store(bad_prod);
        g.ring();
        for (int i = 0; i < 300 && !g.hung_up(); ++i) usleep(10000);
        detached += g.hung_up();
    }
    // Stale: the producer moved back behind the shim's consumer.
    {
        Guest g;
        if (g.attach() != 0) return bad("attach failed");
        for (int i = 0; i < 5; ++i) g.pd();
        g.cb()->cmd_producer.store(2);
        g.ring();
        for (int i = 0; i < 300 && !g.hung_up(); ++i) usleep(10000);
        detached += g.hung_up();
    }
    if (detached != 6) bad("%d of 6 guests with a bad command producer were detached", detached);
    say("command producer past the ring (17, 32, 1000, 2^31, 2^32-1) and stale: %d/6 detached", detached);
}

void case_command_garbage(int rounds) {
    Guest g;
    if (g.attach() != 0) return bad("attach failed");
    int ok = 0, err = 0;
    for (int i = 0; i < rounds; ++i) {
        uint8_t req[abi::kCmdReqBytes];
        for (size_t k = 0; k < sizeof(req); k += 4) {
            uint32_t v = pick(3) ? (pick(2) ? nasty32() : (uint32_t(1 + pick(6)) << 29) | (pick(4) << 21) | (1 + pick(16)))
                                 : r32();
            std::memcpy(req + k, &v, 4);
        }
        // Ring addresses, when a field is one, point somewhere in the arena.
        if (pick(2)) {
            uint64_t a = g.gva() + pick(Guest::kArena / 64) * 64;
            std::memcpy(req, &a, 8);
        }
        uint32_t op = pick(8) ? 1 + pick(uint32_t(abi::CmdOp::kMax) - 1) : nasty32();
        int st = g.cmd(abi::CmdOp(op), req, sizeof(req));
        if (st == -1 || st == -2) return bad("random command %d (op %u): shim %s", i, op, st == -1 ? "hung up" : "silent");
        (st == 0 ? ok : err)++;
    }
    say("command garbage: %d random commands (random ops, nasty sizes, guessed handles): %d succeeded, %d errors",
        rounds, ok, err);
}

void case_handles() {
    Guest g;
    if (g.attach() != 0) return bad("attach failed");
    uint32_t pd = g.pd();
    uint64_t buf = g.alloc(8192);
    auto mr = g.mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE);
    auto cq = g.cq(16);
    auto qp = g.qp(pd, cq.handle, IBV_QPT_RC);
    // Wrong type, freed, double free, in-use objects.
    int wrong = 0;
    for (auto op : {abi::CmdOp::DeallocPd, abi::CmdOp::DeregMr, abi::CmdOp::DestroyCq, abi::CmdOp::DestroyQp,
                    abi::CmdOp::DestroySrq, abi::CmdOp::DestroyAh, abi::CmdOp::QueryQp, abi::CmdOp::QuerySrq})
        for (uint32_t h : {pd, mr.mr_handle, cq.handle, qp.handle, 0u, 0xffffffffu})
            wrong += g.cmd(op, abi::CmdHandleReq{h}) != 0;
    // Everything destroyed in order, then destroyed again: all refused.
    g.cmd(abi::CmdOp::DestroyQp, abi::CmdHandleReq{qp.handle});
    g.cmd(abi::CmdOp::DestroyCq, abi::CmdHandleReq{cq.handle});
    g.cmd(abi::CmdOp::DeregMr, abi::CmdHandleReq{mr.mr_handle});
    g.cmd(abi::CmdOp::DeallocPd, abi::CmdHandleReq{pd});
    int again = 0;
    for (auto op : {abi::CmdOp::DeallocPd, abi::CmdOp::DeregMr, abi::CmdOp::DestroyCq, abi::CmdOp::DestroyQp})
        for (uint32_t h : {pd, mr.mr_handle, cq.handle, qp.handle}) again += g.cmd(op, abi::CmdHandleReq{h}) == 0;
    // Stale handles after re-creation: same slot, new generation.
    uint32_t pd2 = g.pd();
    int stale = g.cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{pd, IBV_ACCESS_LOCAL_WRITE, buf, 4096, buf}) == 0;
    // Guessed handles of every type over the first slots and generations:
    // they name this guest's own (absent) objects, never another guest's.
    int guessed_ok = 0;
    for (uint32_t t = 1; t <= 6; ++t)
        for (uint32_t gen = 0; gen < 4; ++gen)
            for (uint32_t slot = 0; slot < 32; ++slot) {
                uint32_t h = (t << 29) | (gen << 21) | (slot + 1);
                guessed_ok += g.cmd(abi::CmdOp::QueryQp, abi::CmdHandleReq{h}) == 0;
                guessed_ok += g.cmd(abi::CmdOp::DestroyAh, abi::CmdHandleReq{h}) == 0;
            }
    say("handles: wrong-type/zero/all-ones handles on 8 ops (%d refused), double destroy (%d wrongly accepted), "
        "stale PD after re-creation (%s), 1536 guessed handles (%d accepted: own objects only; pd2 %s)",
        wrong, again, stale ? "ACCEPTED" : "refused", guessed_ok, pd2 ? "ok" : "failed");
    if (again || stale) bad("a freed handle was accepted");
}

void case_quota_flood() {
    Guest g;
    if (g.attach() != 0) return bad("attach failed");
    uint64_t t0 = now_ms();
    uint32_t pd1 = g.pd(), pds = pd1 ? 1 : 0;
    while (pds < 70000 && g.pd()) ++pds;
    // MRs over the same 4 KiB until a limit or 20000.
    uint32_t mrs = 0;
    uint64_t buf = g.alloc(4096);
    while (mrs < 20000 && g.mr(pd1, buf, 4096, IBV_ACCESS_LOCAL_WRITE).lkey) ++mrs;
    // CQs with huge rings, QPs with huge queues: refused, never allocated.
    abi::CmdCreateCqReq cq{};
    cq.ring_gva = g.gva() + abi::kControlBlockBytes;
    cq.entries = 1u << 30;
    int big_cq = g.cmd(abi::CmdOp::CreateCq, cq);
    say("quota flood: %u PDs allocated before the limit, %u MRs (of 20000 tried) in %llu ms; CQ of 2^30 entries: %d",
        pds, mrs, (unsigned long long)(now_ms() - t0), big_cq);
    if (big_cq == 0) bad("a CQ of 2^30 entries over a 4 MiB arena was accepted");
}

void case_command_tamper() {
    // A thread rewrites command slots, the producer index and the doorbell
    // while the main thread issues commands: the shim copies a slot out once.
    Guest g;
    if (g.attach() != 0) return bad("attach failed");
    std::atomic<bool> stop{false};
    std::thread t([&] {
        std::mt19937 r(1);
        while (!stop.load()) {
            abi::CmdSlot& s = g.cb()->cmd[r() % abi::kCmdSlots];
            uint32_t v = r();
            std::memcpy(s.req + (r() % (abi::kCmdReqBytes / 4)) * 4, &v, 4);
            if (r() % 64 == 0) std::memcpy(&s.op, &v, 4);
            g.cb()->doorbell.fetch_add(1);
        }
    });
    int answered = 0, hung = 0;
    for (int i = 0; i < 2000 && !g.hung_up(); ++i) {
        int st = i % 2 ? g.cmd(abi::CmdOp::AllocPd, nullptr, 0) : g.cmd(abi::CmdOp::QueryDevice, nullptr, 0);
        if (st == -1) ++hung;
        else if (st != -2) ++answered;
    }
    stop = true;
    t.join();
    say("command tamper: 2000 commands while another thread rewrote slots: %d answered, %s", answered,
        g.hung_up() ? "then detached" : "still attached");
}

// --- rings and WQEs --------------------------------------------------------

void case_wq_indices() {
    Armed a;
    if (!a.ok) return bad("setup failed");
    int st = 0;
    // SQ producer past the ring, then stale; CQ consumer past the ring.
    for (uint32_t p : {9u, 16u, 17u, 0xffffffffu, 0x80000000u}) {
        a.g.ring_header(a.rc.sq.ring)->producer.store(p);
        a.g.ring();
        usleep(2000);
    }
    a.g.ring_header(a.cq.ring)->consumer.store(0xdeadbeef);
    a.g.ring();
    usleep(5000);
    abi::QpAttr q{};
    st = a.g.cmd(abi::CmdOp::QueryQp, abi::CmdHandleReq{a.rc.handle}, &q, sizeof(q));
    // CQ arm bits flipped at random, doorbell hammered.
    auto* notify = reinterpret_cast<abi::CqNotify*>(a.g.at(a.cq.ring + sizeof(abi::RingHeader)));
    for (int i = 0; i < 100000; ++i) {
        notify->arm_seq.store(r32());
        notify->arm_solicited.store(r32());
        a.g.cb()->doorbell.fetch_add(1);
    }
    say("work-queue indices: SQ producer 9/16/17/2^31/2^32-1, CQ consumer 0xdeadbeef, 100000 random arm "
        "values: QueryQp %d (state %u: 6 = ERR)",
        st, q.qp_state);
}

void case_wqe_storm(int seconds) {
    Armed a;
    if (!a.ok) return bad("setup failed");
    // The UD QP also sends to guessed QPNs of other guests (LIDs 1..4) with
    // the default perftest qkey; the RC QP is connected to itself.
    uint64_t end = now_ms() + uint64_t(seconds) * 1000;
    uint64_t posted = 0;
    int reconnects = 0, lost = 0;
    while (now_ms() < end) {
        for (int i = 0; i < 8; ++i) {
            a.random_send(pick(2) ? a.rc : a.ud);
            ++posted;
        }
        // Consume every CQE (with a random consumer now and then).
        auto* h = a.g.ring_header(a.cq.ring);
        h->consumer.store(pick(50) ? h->producer.load() : r32());
        // Random bytes over a whole slot, random producer jumps.
        if (pick(8) == 0) {
            uint8_t* s = a.g.wqe_slot(a.rc.sq, a.rc.sq.prod);
            for (uint32_t k = 0; k < a.rc.sq.stride; ++k) s[k] = uint8_t(r32());
            a.g.publish(a.rc.sq, pick(4) ? 1 : pick(40));
        }
        usleep(200);
        if (pick(16) == 0) {  // back to RTS (the QP is in error after most of this)
            abi::QpAttr at{};
            at.qp_state = IBV_QPS_RESET;
            a.g.modify(a.rc.handle, IBV_QP_STATE, at);
            a.g.modify(a.ud.handle, IBV_QP_STATE, at);
            a.rc.sq.prod = a.ud.sq.prod = 0;
            a.g.ring_header(a.rc.sq.ring)->producer.store(0);
            a.g.ring_header(a.ud.sq.ring)->producer.store(0);
            // A reset QP's ring restarts at 0; a CQ in error stays so: new one.
            if (a.g.connect(a.rc, uint16_t(a.g.lid()), a.rc.qpn) == 0 && a.g.connect(a.ud, 0, 0) == 0) ++reconnects;
        }
        if (a.g.hung_up()) {
            ++lost;
            break;
        }
    }
    say("WQE storm: %llu random WQEs in %d s (opcodes, flags, SGE counts, inline lengths, addresses outside "
        "every segment, guessed lkeys/rkeys, AHs, QPNs of other guests), %d reconnects%s",
        (unsigned long long)posted, seconds, reconnects, lost ? ", then detached" : "");
}

void case_foreign_qps() {
    // RC QPs pointed at every guessed (LID, QPN) of the other guests: the
    // shim treats each like a lost packet (their QPs are connected
    // elsewhere); RDMA WRITEs with guessed rkeys complete in error.
    Armed a;
    if (!a.ok) return bad("setup failed");
    int tried = 0;
    for (uint16_t lid = 1; lid <= 3; ++lid) {
        for (uint32_t qpn = 2; qpn < 66; qpn += 1) {
            abi::QpAttr at{};
            at.qp_state = IBV_QPS_RESET;
            a.g.modify(a.rc.handle, IBV_QP_STATE, at);
            a.rc.sq.prod = 0;
            a.g.ring_header(a.rc.sq.ring)->producer.store(0);
            if (a.g.connect(a.rc, lid, qpn) != 0) continue;
            abi::SendWqe w{};
            w.opcode = pick(2) ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
            w.send_flags = IBV_SEND_SIGNALED;
            w.num_sge = 1;
            w.remote_addr = pick(2) ? a.buf : 0x7f0000000000ull + uint64_t(pick(1 << 20)) * 4096;
            w.rkey = Armed::guess_key();
            abi::Sge s{a.buf, 64, a.mr.lkey};
            a.g.post_send(a.rc.sq, w, {&s, 1});
            ++tried;
        }
    }
    usleep(50000);
    say("foreign QPs: RC QP connected in turn to %d guessed (LID, QPN) of guests a, b, c with RDMA WRITE/READ "
        "and guessed rkeys",
        tried);
}

void case_fd_abuse(int seconds) {
    // Saturated cmd-done eventfd (a write would block), O_NONBLOCK cleared
    // in a loop on every fd the shim reads or writes, a full async pipe,
    // then commands and async events (QP errors).
    Armed a;
    if (!a.ok) return bad("setup failed");
    a.g.drain_done = false;
    uint64_t big = 0xfffffffffffffffeull, v;
    (void)!::read(a.g.done_fd(), &v, sizeof(v));
    (void)!::write(a.g.done_fd(), &big, sizeof(big));
    char junk[4096] = {};
    int filled = 0;
    while (::write(a.g.async_w(), junk, sizeof(junk)) > 0) ++filled;
    std::atomic<bool> stop{false};
    std::thread t([&] {
        while (!stop.load())
            for (int fd : {a.g.done_fd(), a.g.kick_fd(), a.g.async_w()}) {
                int fl = fcntl(fd, F_GETFL);
                fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
            }
    });
    // Commands: the provider side reads done_seq, so they complete even
    // though the eventfd cannot be written. The first write that blocks
    // (the guard timer fires) gets the context detached.
    uint64_t t0 = now_ms(), worst = 0;
    int n = 0;
    uint64_t end = t0 + uint64_t(seconds) * 1000;
    bool detached = false;
    while (now_ms() < end) {
        uint64_t c0 = now_ms();
        abi::QpAttr at{};
        at.qp_state = IBV_QPS_ERR;
        int st = a.g.modify(a.rc.handle, IBV_QP_STATE, at);
        at.qp_state = IBV_QPS_RESET;
        if (st >= 0) st = a.g.modify(a.rc.handle, IBV_QP_STATE, at);
        worst = std::max(worst, now_ms() - c0);
        n += 2;
        if (st == -2) bad("a command got no answer within 3 s under fd abuse");
        if (st < 0) {
            detached = st == -1;
            break;
        }
    }
    stop = true;
    t.join();
    say("fd abuse: cmd-done eventfd saturated, async pipe full (%d KiB), O_NONBLOCK cleared in a loop on the "
        "kick/cmd-done/async fds: %d commands in %llu ms (worst %llu ms), %s",
        filled * 4, n, (unsigned long long)(now_ms() - t0), (unsigned long long)worst,
        detached ? "then detached (a guest fd blocked the shim)" : "never caught blocking");
}

void case_destroy_races(int seconds) {
    // WQEs posted by one thread while the other destroys and re-creates
    // the QP, CQ and MR under them; segments removed under MRs.
    uint64_t end = now_ms() + uint64_t(seconds) * 1000;
    int rounds = 0;
    while (now_ms() < end) {
        Armed a;
        if (!a.ok) return bad("setup failed");
        std::atomic<bool> stop{false};
        std::thread t([&] {
            while (!stop.load()) {
                a.random_send(a.rc);
                usleep(50);
            }
        });
        a.g.cmd(abi::CmdOp::DeregMr, abi::CmdHandleReq{a.mr.mr_handle});
        a.g.cmd(abi::CmdOp::DestroyCq, abi::CmdHandleReq{a.cq.handle});  // in use: EBUSY
        a.g.cmd(abi::CmdOp::DestroyQp, abi::CmdHandleReq{a.rc.handle});
        a.g.cmd(abi::CmdOp::DestroyCq, abi::CmdHandleReq{a.cq.handle});
        a.mr = a.g.mr(a.pd, a.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
        a.g.cmd(abi::CmdOp::DeallocPd, abi::CmdHandleReq{a.pd});
        stop = true;
        t.join();
        ++rounds;
        // Half the time the guest just goes, with everything in flight.
    }
    say("destroy races: %d rounds of DeregMr/DestroyCq/DestroyQp/DeallocPd while another thread posted WQEs",
        rounds);
}

}  // namespace

// --flood-fds SECONDS (fd_flood.sh): contexts with as many completion
// channels as the shim takes, until it refuses a channel or an attach; then
// holds them all for SECONDS while other guests must still attach and work.
int flood_fds(int hold_seconds) {
    std::vector<std::unique_ptr<Guest>> guests;
    int channels = 0, attach_status = 0, channel_status = 0;
    while (guests.size() < 64) {
        auto g = std::make_unique<Guest>();
        if ((attach_status = g->attach()) != 0) break;
        int here = 0;
        for (uint32_t id = 1; id <= 1024; ++id) {
            abi::SockChannel m = abi_client::create_channel_msg(id);
            int p[2];
            if (pipe2(p, O_CLOEXEC) != 0) {
                bad("pipe2: %s", strerror(errno));
                return 1;
            }
            send_msg(g->sock(), &m, sizeof(m), {p[1]});
            ::close(p[0]);
            ::close(p[1]);
            channel_status = await_reply(g->sock(), 3000);
            if (channel_status != 0) break;
            ++here;
        }
        channels += here;
        guests.push_back(std::move(g));
        if (channel_status != 0) break;
    }
    say("fd flood: %zu contexts attached, %d completion channels, then refused (attach %d, channel %d); "
        "holding them %d s",
        guests.size(), channels, attach_status, channel_status, hold_seconds);
    std::fflush(stdout);
    if (attach_status == 0 && channel_status == 0) bad("never refused: no fd quota");
    sleep(unsigned(hold_seconds));
    return g_failures ? 1 : 0;
}

// Datagrams from a UD QP of this guest to one (LID, QPN): 64-byte SENDs of
// 0xee bytes. The sender's completions succeed whether or not a datagram
// arrives, as on a real fabric.
class UdSender {
public:
    UdSender(uint16_t lid, uint32_t qpn) : lid_(lid), qpn_(qpn) {
        if (!a_.ok) {
            bad("setup failed");
            return;
        }
        if (a_.g.create_ah(a_.pd, lid, ah_) != 0) {
            bad("create_ah to LID %u refused", unsigned(lid));
            return;
        }
        std::memset(a_.g.at(a_.buf), 0xee, 64);
        ok = true;
    }
    bool ok = false;

    // Sends `n` (at most 8) datagrams, the i-th with qkey(i), and waits for
    // their completions: the send queue never overflows, so each datagram
    // really leaves. False (reported) when a send fails or hangs.
    bool send(int n, const std::function<uint32_t(int)>& qkey) {
        for (int i = 0; i < n; ++i) {
            abi::SendWqe w{};
            w.wr_id = uint64_t(i);
            w.opcode = IBV_WR_SEND;
            w.send_flags = IBV_SEND_SIGNALED;
            w.num_sge = 1;
            w.ah_handle = ah_;
            w.remote_qpn = qpn_;
            w.remote_qkey = qkey(i);
            abi::Sge s{a_.buf, 64, a_.mr.lkey};
            a_.g.post_send(a_.ud.sq, w, {&s, 1});
        }
        std::vector<abi::Cqe> done;
        for (uint64_t until = now_ms() + 5000; int(done.size()) < n && now_ms() < until;)
            if (!a_.g.poll_cq(a_.cq, uint32_t(n - int(done.size())), &done)) usleep(200);
        if (int(done.size()) < n) {
            bad("datagrams to LID %u: %d of %d sends completed within 5 s", unsigned(lid_), int(done.size()), n);
            return false;
        }
        for (const abi::Cqe& c : done)
            if (c.status != IBV_WC_SUCCESS) {
                bad("a datagram's send completed with status %u", c.status);
                return false;
            }
        return true;
    }

private:
    Armed a_;
    uint16_t lid_;
    uint32_t qpn_;
    uint32_t ah_ = 0;
};

// A tenant that learned a victim's UD address (LID, QPN) and qkey, as a
// peer of an exchange does, sends it datagrams: only a partition (P_Key)
// stands between them (partitions.sh puts the two guests in different
// ones).
int ud_inject(uint16_t lid, uint32_t qpn, uint32_t qkey, int count) {
    UdSender u(lid, qpn);
    if (!u.ok) return 1;
    int sent = 0;
    for (; sent < count; sent += 8)
        if (!u.send(std::min(8, count - sent), [qkey](int) { return qkey; })) return 1;
    say("ud inject: %d datagrams of 64 bytes to LID %u QPN 0x%06x with qkey 0x%08x", count, unsigned(lid), qpn, qkey);
    return g_failures ? 1 : 0;
}

// A tenant that learned a victim's UD address but not its qkey guesses it,
// as fast as it can for `seconds` (adversarial.sh): the shim throttles it to
// vrdma-shim --qkey-guess-limit guesses a second, which the script checks
// in vrdmactl counters. The guesses never have the high bit (that would
// mean this QP's own qkey, the perftest default 0x11111111 of Armed) and
// are never that default, which the victim uses.
int qkey_guess(uint16_t lid, uint32_t qpn, int seconds) {
    UdSender u(lid, qpn);
    if (!u.ok) return 1;
    auto guess = [](int) {
        uint32_t q;
        do q = r32() & 0x7fffffffu;
        while (q == 0x11111111u);
        return q;
    };
    const uint64_t t0 = now_ms(), end = t0 + uint64_t(seconds) * 1000;
    uint64_t sent = 0;
    while (now_ms() < end) {
        if (!u.send(8, guess)) return 1;
        sent += 8;
    }
    const uint64_t ms = std::max<uint64_t>(1, now_ms() - t0);
    say("qkey guess: %llu datagrams with guessed qkeys to LID %u QPN 0x%06x in %llu ms (%llu a second)",
        (unsigned long long)sent, unsigned(lid), qpn, (unsigned long long)ms,
        (unsigned long long)(sent * 1000 / ms));
    return g_failures ? 1 : 0;
}

// "LID:QPN[:QKEY]", each in C notation (0x... for hex).
bool parse_ud_target(const char* s, unsigned& lid, unsigned& qpn, unsigned& qkey) {
    char* end = nullptr;
    lid = unsigned(std::strtoul(s, &end, 0));
    if (*end != ':') return false;
    qpn = unsigned(std::strtoul(end + 1, &end, 0));
    if (*end == ':') qkey = unsigned(std::strtoul(end + 1, &end, 0));
    return *end == 0 && lid && lid < 0xc000 && qpn && qpn <= 0xffffff;
}

int main(int argc, char** argv) {
    int seconds = 20;
    int flood_seconds = -1;
    int inject = 0, guess_seconds = 0;
    unsigned inject_lid = 0, inject_qpn = 0, inject_qkey = 0x11111111;
    uint64_t seed = uint64_t(time(nullptr));
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--seconds" && i + 1 < argc) seconds = std::atoi(argv[++i]);
        else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 0);
        else if (a == "--flood-fds" && i + 1 < argc) flood_seconds = std::atoi(argv[++i]);
        else if (a == "--ud-inject" && i + 2 < argc && parse_ud_target(argv[i + 1], inject_lid, inject_qpn, inject_qkey)) {
            inject = std::atoi(argv[i + 2]);
            i += 2;
        } else if (a == "--qkey-guess" && i + 2 < argc && parse_ud_target(argv[i + 1], inject_lid, inject_qpn, inject_qkey)) {
            guess_seconds = std::atoi(argv[i + 2]);
            i += 2;
        } else {
            std::fprintf(stderr,
                         "usage: adversarial_guest [--seconds N] [--seed S] | --flood-fds SECONDS\n"
                         "       | --ud-inject LID:QPN[:QKEY] COUNT | --qkey-guess LID:QPN SECONDS\n");
            return 2;
        }
    }
    rng.seed(seed);
    const char* sysfs = getenv("SYSFS_PATH");
    if (!sysfs) {
        std::fprintf(stderr, "adversarial_guest: run it under vrdma-run (SYSFS_PATH is not set)\n");
        return 2;
    }
    std::ifstream f(std::string(sysfs) + "/class/infiniband/" + abi::kDeviceName + "/" + abi::kSocketAttr);
    std::getline(f, g_socket);
    if (g_socket.empty()) {
        std::fprintf(stderr, "adversarial_guest: no vrdma_socket under %s\n", sysfs);
        return 2;
    }
    if (flood_seconds >= 0) return flood_fds(flood_seconds);
    if (inject > 0) return ud_inject(uint16_t(inject_lid), inject_qpn, inject_qkey, inject);
    if (guess_seconds > 0) return qkey_guess(uint16_t(inject_lid), inject_qpn, guess_seconds);
    say("adversarial guest: seed %llu, %d s of timed cases", (unsigned long long)seed, seconds);
    const int slice = std::max(1, seconds / 4);
    struct Named {
        const char* name;
        std::function<void()> run;
    };
    std::vector<Named> cases = {
        {"socket garbage", case_socket_garbage},
        {"attach refusals", case_attach_refusals},
        {"segments", case_segments},
        {"connection flood", case_connection_flood},
        {"command indices", case_command_indices},
        {"command garbage", [] { case_command_garbage(5000); }},
        {"handles", case_handles},
        {"quota flood", case_quota_flood},
        {"command tamper", case_command_tamper},
        {"work-queue indices", case_wq_indices},
        {"WQE storm", [slice] { case_wqe_storm(slice); }},
        {"foreign QPs", case_foreign_qps},
        {"fd abuse", [slice] { case_fd_abuse(slice); }},
        {"destroy races", [slice] { case_destroy_races(slice); }},
    };
    for (auto& c : cases) {
        uint64_t t0 = now_ms();
        c.run();
        if (!shim_answers(c.name)) break;
        say("  (%s: %llu ms; the shim still answers)", c.name, (unsigned long long)(now_ms() - t0));
    }
    say("adversarial guest: %s (%d unexpected)", g_failures ? "FAILED" : "done", g_failures);
    return g_failures ? 1 : 0;
}
