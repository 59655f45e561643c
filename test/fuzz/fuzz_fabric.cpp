// libFuzzer target: a hostile peer shim on the fabric (src/shim/transport/
// fabric). One Engine serves two guests: a (LID 1) with MRs granted for
// remote access, RC and UD QPs connected to QPs of the peer (LIDs
// 0x100-0x1ff), receives posted and requests of its own in flight; b (LID
// 2), a bystander whose one QP is connected to the peer but which granted
// nothing (its MR has no remote access, no receive is posted). A Link
// (link.h) runs over one end of a UNIX socketpair; the harness is the peer
// on the other end: it completes the TLS handshake with the fabric key and
// then writes the input through its TLS channel, as the byte stream that
// follows: every input byte reaches the link's parser in a valid record
// (behind the decryption, where a peer that knows the key can reach).
//
// Input:
//   byte 0      bits 0-4: a posts on its RC QP a READ, a fetch-and-add, a
//               compare-and-swap, a SEND, a 70 KiB WRITE (PSNs 0.. in that
//               order); bit 5: a sends a UD datagram to the peer; bit 7: the
//               harness sends no Hello (the stream starts with the peer's
//               Hello, inside the channel).
//   byte 1      n: the number of chunks (n % 16)
//   n x 3 bytes a chunk: u16 length, u8 actions done after writing it
//               (bit 0 link reads, 1 link writes, 2 engine pass, 3 clock
//               +1 ms, 4 drain what the link wrote, 5 the peer half-closes)
//   the rest    the stream (what no chunk took is written at the end)
// The harness then pumps until quiet and closes the connection.
//
// After every input (abort on violation): b's arena, a's MR without remote
// access and the guard pages around a's MRs are bit for bit unchanged (so is
// a's arena past its allocations); a local SEND from b to a still completes.
// ASan and UBSan catch the rest.
//
// The FabricWorld is built once and reset between inputs (QPs to RESET and back,
// receives posted again, MR contents restored): about ten times cheaper than
// building one per input. The arenas are mapped at fixed addresses so that
// the seeds (fabric_seeds.h; VRDMA_FUZZ_FABRIC_SEEDS=DIR writes them) can
// name guest addresses. VRDMA_FUZZ_FABRIC_VERBOSE=1 prints, per input, how
// the link ended and a's completions (to check what a seed reaches).
#include <sys/socket.h>

#include <memory>

#include "fabric_test_util.h"
#include "fuzz_common.h"
#include "secure_random.h"

using namespace vrdma::fuzz;
namespace ft = vrdma::fabric_test;
namespace fab = vrdma::shim::fabric;

namespace {

constexpr uint16_t kLidA = 1, kLidB = 2;
constexpr uint16_t kPeerFirst = 0x100, kPeerLast = 0x1ff;
constexpr uint32_t kPeerQpA = 0x300, kPeerQpA2 = 0x301, kPeerQpUd = 0x302, kPeerQpB = 0x304;
constexpr uint32_t kQkey = 0x11111111;
// Clear of what ASan maps (its allocator lives at 0x600000000000).
constexpr uint64_t kGvaA = 0x5a0000000000ull, kGvaB = 0x5b0000000000ull;
constexpr uint64_t kArenaA = 1 << 20, kArenaB = 256 << 10;
constexpr uint64_t kRemoteLen = 192 << 10, kLocalLen = 192 << 10;
constexpr uint32_t kAll =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint8_t kGuard = 0x5c;
constexpr const char* kKey = "the fabric key of the fuzz harness";

// Post flags of byte 0.
enum : uint8_t {
    kPostRead = 1,
    kPostFaa = 2,
    kPostCas = 4,
    kPostSend = 8,
    kPostWrite = 16,
    kPostUd = 32,
    kRaw = 128,
};
// Chunk actions.
enum : uint8_t { kActRead = 1, kActFlush = 2, kActPoll = 4, kActClock = 8, kActDrain = 16, kActShut = 32 };

// One attached process whose arena is mapped at a fixed guest address.
class FixedGuest : public abi_client::Client {
public:
    FixedGuest(Engine& eng, const GuestIdentity& g, uint64_t gva, uint64_t len)
        : Client(abi_client::in_process(eng)), eng_(eng) {
        if (!arena().open(len, F_SEAL_SHRINK, "fuzz-fabric-arena", gva)) std::abort();
        Context* c = abi_client::attach_in_process(eng, g, *this);
        if (!c) std::abort();
        ctx_id_ = c->id();
    }
    bool alive() {
        Context* c = eng_.find_context(ctx_id_);
        return c && !c->dead;
    }
    uint64_t must_alloc(uint64_t bytes, uint64_t align = 64) {
        uint64_t g = alloc(bytes, align);
        if (!g) std::abort();
        return g;
    }
    MrInfo mr(uint32_t pd, uint64_t len, uint32_t access, uint8_t fill) {
        uint64_t addr = must_alloc(len, 4096);
        std::memset(at(addr), fill, len);
        MrInfo m;
        if (reg_mr(pd, addr, len, access, m)) std::abort();
        return m;
    }
    // A guard page: nobody may write it.
    uint64_t guard() {
        uint64_t g = must_alloc(4096, 4096);
        std::memset(at(g), kGuard, 4096);
        return g;
    }

private:
    Engine& eng_;
    uint64_t ctx_id_ = 0;
};

// A send WQE with its SGEs (num_sge set from them).
void post_send(abi_client::Client& c, WqView& wq, abi::SendWqe w, std::vector<abi::Sge> sges) {
    w.num_sge = uint32_t(sges.size());
    c.post_send(wq, w, sges);
}

struct FabricWorld {
    Engine eng;
    const GuestIdentity& ga;
    const GuestIdentity& gb;
    FixedGuest a, b;
    ft::LinkTransport to_peer;
    fab::TlsContext tls;

    uint32_t a_pd = 0, b_pd = 0, a_ah = 0;
    std::vector<uint64_t> guards;
    MrInfo a_remote, a_local, a_private, a_live, b_private;
    CqView a_cq, a_cq_loc, b_cq_loc, b_cq_peer;
    QpView a_rc, a_rc2, a_ud, a_loc, b_loc, b_rc;
    uint64_t a_end = 0;  // a's arena is untouched from here on
    std::vector<uint8_t> b_snapshot;
    uint8_t live_seq = 0;
    bool broken = false;  // setup failed once: build a new FabricWorld

    FabricWorld()
        : ga(eng.add_guest("a", kLidA, 0x1111)),
          gb(eng.add_guest("b", kLidB, 0x2222)),
          a(eng, ga, kGvaA, kArenaA),
          b(eng, gb, kGvaB, kArenaB) {
        secure_random_make_predictable(1);  // the same QPNs and keys in every run (the seeds name them)
        eng.set_clock(fake_clock);
        if (!ft::make_tls(tls, kKey)) std::abort();
        if (!eng.routes().add(kPeerFirst, kPeerLast, &to_peer)) std::abort();
        to_peer.routed_in = &eng;
        if (a.alloc_pd(a_pd) || b.alloc_pd(b_pd)) std::abort();
        guards.push_back(a.guard());
        a_remote = a.mr(a_pd, kRemoteLen, kAll, 0xa2);
        guards.push_back(a.guard());
        a_local = a.mr(a_pd, kLocalLen, IBV_ACCESS_LOCAL_WRITE, 0);
        guards.push_back(a.guard());
        a_private = a.mr(a_pd, 4096, IBV_ACCESS_LOCAL_WRITE, 0xa3);
        guards.push_back(a.guard());
        a_live = a.mr(a_pd, 4096, IBV_ACCESS_LOCAL_WRITE, 0);
        guards.push_back(a.guard());
        b_private = b.mr(b_pd, 4096, IBV_ACCESS_LOCAL_WRITE, 0xb2);
        if (a.create_cq(256, a_cq) || a.create_cq(16, a_cq_loc) || b.create_cq(16, b_cq_loc) ||
            b.create_cq(16, b_cq_peer))
            std::abort();
        abi_client::QpSpec rc;
        rc.entries = 16;
        rc.stride = 512;
        rc.rq_stride = 128;
        abi_client::QpSpec ud = rc;
        ud.type = IBV_QPT_UD;
        if (a.create_qp(a_pd, a_cq.handle, a_cq.handle, rc, a_rc) ||
            a.create_qp(a_pd, a_cq.handle, a_cq.handle, rc, a_rc2) ||
            a.create_qp(a_pd, a_cq.handle, a_cq.handle, ud, a_ud) ||
            a.create_qp(a_pd, a_cq_loc.handle, a_cq_loc.handle, rc, a_loc) ||
            b.create_qp(b_pd, b_cq_loc.handle, b_cq_loc.handle, rc, b_loc) ||
            b.create_qp(b_pd, b_cq_peer.handle, b_cq_peer.handle, rc, b_rc))
            std::abort();
        if (a.create_ah(a_pd, kPeerFirst, a_ah)) std::abort();
        a_end = a.alloc(0, 1);
        abi_client::RcPath p;
        p.dlid = kLidB;
        p.dqpn = b_loc.qpn;
        if (a.connect_rc(a_loc.handle, p)) std::abort();
        p.dlid = kLidA;
        p.dqpn = a_loc.qpn;
        if (b.connect_rc(b_loc.handle, p)) std::abort();
    }

    // Every QP the peer can reach back to RTS, receives posted, MR contents
    // as at the start. False if the shim refused something (the FabricWorld is
    // then rebuilt).
    bool reset() {
        a.poll_cq(a_cq, 1024);
        a.poll_cq(a_cq_loc, 1024);
        b.poll_cq(b_cq_loc, 1024);
        b.poll_cq(b_cq_peer, 1024);
        abi::QpAttr r{};
        r.qp_state = IBV_QPS_RESET;
        abi_client::RcPath p;
        p.retry_cnt = 3;
        p.rnr_retry = 3;
        p.timeout = 8;  // ~1 ms: a clock action is a timeout
        p.min_rnr_timer = 1;
        if (a.modify_qp(a_rc.handle, IBV_QP_STATE, r) || a.modify_qp(a_rc2.handle, IBV_QP_STATE, r) ||
            a.modify_qp(a_ud.handle, IBV_QP_STATE, r) || b.modify_qp(b_rc.handle, IBV_QP_STATE, r))
            return false;
        p.dlid = kPeerFirst;
        p.dqpn = kPeerQpA;
        if (a.connect_rc(a_rc.handle, p)) return false;
        p.dqpn = kPeerQpA2;
        p.access = IBV_ACCESS_LOCAL_WRITE;  // grants the peer nothing
        if (a.connect_rc(a_rc2.handle, p)) return false;
        p.dlid = kPeerFirst + 1;
        p.dqpn = kPeerQpB;
        p.access = kAll;  // the QP would allow it, b's MR does not
        if (b.connect_rc(b_rc.handle, p)) return false;
        if (a.connect_ud(a_ud.handle, kQkey)) return false;
        std::memset(a.at(a_remote.addr), 0xa2, kRemoteLen);
        std::memset(a.at(a_local.addr), 0, kLocalLen);
        // a's RC receives: 128 KiB, 16 KiB, two pieces, none.
        a.post_recv(a_rc.rq, 1, {abi::Sge{a_local.addr, 128 << 10, a_local.lkey}});
        a.post_recv(a_rc.rq, 2, {abi::Sge{a_local.addr + (128 << 10), 16 << 10, a_local.lkey}});
        a.post_recv(a_rc.rq, 3,
                    {abi::Sge{a_local.addr + 1000, 100, a_local.lkey}, abi::Sge{a_local.addr + 5000, 200, a_local.lkey}});
        a.post_recv(a_rc.rq, 4, {});
        for (uint32_t i = 0; i < 4; ++i)
            a.post_recv(a_ud.rq, 10 + i, {abi::Sge{a_local.addr + (144 << 10) + i * 8192, 4096 + 40, a_local.lkey}});
        eng.poll_once();
        b_snapshot.assign(b.base() + abi::kControlBlockBytes, b.base() + kArenaB);
        return a.alive() && b.alive();
    }

    // a's own requests to the peer (PSNs 0.. in flag order).
    void post(uint8_t flags) {
        auto wqe = [](uint64_t id, uint32_t op) {
            abi::SendWqe w{};
            w.wr_id = id;
            w.opcode = op;
            w.send_flags = IBV_SEND_SIGNALED;
            return w;
        };
        const uint64_t res = a_local.addr + (176 << 10);  // READ data and atomic results
        if (flags & kPostRead) {
            auto w = wqe(100, IBV_WR_RDMA_READ);
            w.remote_addr = 0x10000;
            w.rkey = 0x1234;
            post_send(a, a_rc.sq, w, {{a_local.addr + (32 << 10), 40000, a_local.lkey},
                                                          {a_local.addr + (96 << 10), 40000, a_local.lkey}});
        }
        if (flags & kPostFaa) {
            auto w = wqe(101, IBV_WR_ATOMIC_FETCH_AND_ADD);
            w.remote_addr = 0x20000;
            w.rkey = 0x1234;
            w.compare_add = 1;
            post_send(a, a_rc.sq, w, {{res, 8, a_local.lkey}});
        }
        if (flags & kPostCas) {
            auto w = wqe(102, IBV_WR_ATOMIC_CMP_AND_SWP);
            w.remote_addr = 0x20008;
            w.rkey = 0x1234;
            w.compare_add = 5;
            w.swap = 6;
            post_send(a, a_rc.sq, w, {{res + 8, 8, a_local.lkey}});
        }
        if (flags & kPostSend) post_send(a, a_rc.sq, wqe(103, IBV_WR_SEND), {{a_remote.addr, 300, a_remote.lkey}});
        if (flags & kPostWrite) {
            auto w = wqe(104, IBV_WR_RDMA_WRITE);
            w.remote_addr = 0x40000;
            w.rkey = 0x1234;
            post_send(a, a_rc.sq, w, {{a_remote.addr, 70000, a_remote.lkey}});
        }
        if (flags & kPostUd) {
            auto w = wqe(105, IBV_WR_SEND);
            w.ah_handle = a_ah;
            w.remote_qpn = kPeerQpUd;
            w.remote_qkey = kQkey;
            post_send(a, a_ud.sq, w, {{a_remote.addr, 64, a_remote.lkey}});
        }
    }

    // memcmp, not loops: the harness's own comparisons would be traced
    // for coverage and cost more than the input.
    void check() {
        static uint8_t guard_page[4096], private_page[4096], zero_page[4096];
        static bool init = (std::memset(guard_page, kGuard, 4096), std::memset(private_page, 0xa3, 4096), true);
        (void)init;
        for (uint64_t g : guards)
            if (std::memcmp(a.at(g), guard_page, 4096) != 0) violation("a guard page beside a's MRs changed");
        if (std::memcmp(a.at(a_private.addr), private_page, 4096) != 0)
            violation("a's MR without remote access changed");
        const uint8_t* tail = a.at(a_end);
        const uint64_t tail_len = a.gva() + kArenaA - a_end;
        for (uint64_t i = 0; i < tail_len; i += 4096)
            if (std::memcmp(tail + i, zero_page, std::min<uint64_t>(4096, tail_len - i)) != 0)
                violation("a's arena changed past everything allocated in it");
        if (std::memcmp(b_snapshot.data(), b.base() + abi::kControlBlockBytes, b_snapshot.size()) != 0)
            violation("guest b's arena changed: b granted nothing");
    }

    // A local SEND from b to a: the engine still works.
    void check_alive() {
        ++live_seq;
        a.post_recv(a_loc.rq, 7000 + live_seq, {abi::Sge{a_live.addr, 64, a_live.lkey}});
        abi::SendWqe w{};
        w.wr_id = 8000 + live_seq;
        w.opcode = IBV_WR_SEND;
        w.send_flags = IBV_SEND_SIGNALED;
        a.at(a_live.addr)[0] = uint8_t(~0xb2);
        post_send(b, b_loc.sq, w, {{b_private.addr, 64, b_private.lkey}});
        eng.poll_once();
        eng.poll_once();
        std::vector<abi::Cqe> ra, sb;
        a.poll_cq(a_cq_loc, 16, &ra);
        b.poll_cq(b_cq_loc, 16, &sb);
        if (ra.size() != 1 || sb.size() != 1 || ra[0].status != IBV_WC_SUCCESS || sb[0].status != IBV_WC_SUCCESS ||
            ra[0].byte_len != 64 || a.at(a_live.addr)[0] != 0xb2) {
            std::fprintf(stderr, "local send: len %u data %02x; %zu receive(s) (status %u), %zu send(s) (status %u)\n", ra.empty() ? 0u : ra[0].byte_len, a.at(a_live.addr)[0], ra.size(),
                         ra.empty() ? 0u : ra[0].status, sb.size(), sb.empty() ? 0u : sb[0].status);
            violation("a local send between the two guests failed after the input");
        }
    }
};

std::unique_ptr<FabricWorld> g_world;

FabricWorld& world() {
    if (!g_world || g_world->broken) {
        g_world.reset();
        g_now = 1'000'000'000;
        g_world = std::make_unique<FabricWorld>();
    }
    return *g_world;
}

}  // namespace

#include "fabric_seeds.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    quiet_logs();
    if (const char* dir = getenv("VRDMA_FUZZ_FABRIC_SEEDS")) {
        FabricWorld& w = world();
        int n = fabric_seeds::write_all(dir, w);
        std::fprintf(stderr, "fuzz_fabric: wrote %d seeds to %s\n", n, dir);
        std::exit(n > 0 ? 0 : 1);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FabricWorld* w = &world();
    if (!w->reset()) {
        w->broken = true;
        w = &world();
        if (!w->reset()) violation("the harness's FabricWorld cannot be reset");
    }
    Input in(data, size);
    const uint8_t flags = in.u8();
    const uint32_t nchunks = in.u8() % 16;
    struct Chunk {
        uint16_t len;
        uint8_t act;
    } chunks[16];
    for (uint32_t i = 0; i < nchunks; ++i) {
        chunks[i].len = in.u16();
        chunks[i].act = in.u8();
    }
    const size_t hdr = size - in.left();
    const uint8_t* stream = data + hdr;
    size_t left = size - hdr;

    int fds[2];
    if (!ft::socket_pair(fds)) std::abort();
    vrdma::UniqueFd peer(fds[1]);
    auto link = std::make_unique<fab::Link>(w->eng, w->tls, vrdma::UniqueFd(fds[0]), false, ft::instance(1), kLidA,
                                            kLidB, 0, "fuzz-peer");
    fab::TlsChannel channel(w->tls, peer.get(), true);
    w->to_peer.link = link.get();
    auto link_open = [&] { return link->state() != fab::LinkState::Closed; };
    auto pump = [&] {
        if (link_open()) link->on_readable();
        if (link_open()) link->flush();
        if (channel.handshake_done()) ft::drain(peer.get());  // what the link wrote is not read back
        w->eng.poll_once();
        if (link_open()) link->flush();
        if (channel.handshake_done()) ft::drain(peer.get());
    };
    // The handshake, then the link's Hello read through the channel (what
    // the link writes after it is drained raw and never decrypted).
    auto handshake_pump = [&] {
        if (link_open()) link->flush();
        if (link_open()) link->on_readable();
        if (link_open()) link->flush();
    };
    if (flags & kRaw) {
        for (int i = 0; channel.handshake() != fab::TlsChannel::Step::Done; ++i) {
            if (i > 1000 || !link_open()) violation("the TLS handshake with the right key did not complete");
            handshake_pump();
        }
    } else {
        if (!ft::peer_handshake(channel, ft::make_hello(kPeerFirst, kPeerLast), handshake_pump))
            violation("the handshake with the right key did not complete");
        link->on_readable();
        if (link->state() != fab::LinkState::Up) violation("the handshake with the right key failed");
        w->post(flags);
        w->eng.poll_once();
        link->flush();
        ft::drain(peer.get());
    }

    // After the Hellos the stream goes in frames, each a valid frame
    // holding hostile bytes; a raw stream stays in TLS records.
    std::unique_ptr<fab::FrameChannel> frames;
    if (!(flags & kRaw)) frames = ft::peer_frames(channel, peer.get(), w->tls.mode(), true);
    bool shut = false;
    auto write = [&](size_t n) {
        n = std::min(n, left);
        if (n && !shut) {
            const bool ok = frames ? ft::channel_write_all(*frames, stream, n, pump)
                                   : ft::channel_write_all(channel, stream, n, pump);
            if (!ok) shut = true;  // the link closed
        }
        stream += n;
        left -= n;
    };
    for (uint32_t i = 0; i < nchunks && left > 0; ++i) {
        write(chunks[i].len);
        const uint8_t act = chunks[i].act;
        if ((act & kActRead) && link_open()) link->on_readable();
        if ((act & kActFlush) && link_open()) link->flush();
        if (act & kActPoll) w->eng.poll_once();
        if (act & kActClock) g_now += 1'000'000;
        if (act & kActDrain) ft::drain(peer.get());
        if ((act & kActShut) && !shut) {
            ::shutdown(peer.get(), SHUT_WR);
            shut = true;
        }
    }
    write(left);
    // Until quiet: the link reads all, answers, the engine runs.
    for (int i = 0; i < 64; ++i) {
        const uint64_t before = link->stats.rx_bytes + link->stats.tx_bytes;
        pump();
        if (link->stats.rx_bytes + link->stats.tx_bytes == before && i > 2) break;
    }
    static const bool verbose = getenv("VRDMA_FUZZ_FABRIC_VERBOSE") != nullptr;
    if (verbose)
        std::fprintf(stderr, "link %s (%s): rx %llu msgs, tx %llu msgs, %llu errors\n",
                     link_open() ? "open" : "closed", link->close_reason().c_str(),
                     (unsigned long long)link->stats.rx_msgs, (unsigned long long)link->stats.tx_msgs,
                     (unsigned long long)link->stats.errors);
    // The peer goes away mid-whatever: unfinished messages fail.
    ::shutdown(peer.get(), SHUT_RDWR);
    pump();
    if (verbose) {
        std::vector<abi::Cqe> cqes;
        w->a.poll_cq(w->a_cq, 256, &cqes);
        for (const abi::Cqe& c : cqes)
            std::fprintf(stderr, "  a: wr_id %llu status %u opcode %u byte_len %u\n", (unsigned long long)c.wr_id,
                         c.status, c.opcode, c.byte_len);
    }
    w->to_peer.link = nullptr;
    link.reset();
    w->eng.poll_once();
    w->eng.poll_once();
    if (!w->a.alive() || !w->b.alive()) violation("a guest's context died of the peer's input");
    w->check();
    w->check_alive();
    return 0;
}
