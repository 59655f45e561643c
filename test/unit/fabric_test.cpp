// The fabric between shims (src/shim/transport/fabric), in process: two
// Engines ("shims" A and B, one guest each: LIDs 1 and 2) joined by two
// Links over a UNIX socketpair. A routes LID 2 to its Link and B routes
// LID 1 to its own (test/common/fabric_test_util.h: LinkTransport, what
// fabric::Peer does without a Fabric around it). Both engines and links are
// pumped until quiet. What every transport must do (each opcode, RNR,
// errors, flushes, SRQ, UD) is in shim_transport_test.cpp, which runs over
// the fabric as well (Workers::Fabric); here is what only the fabric has:
// the handshake and frames, segments, a lost link, hostile peers.
#include <arpa/inet.h>
#include <sys/socket.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "device_model.h"
#include "fabric_test_util.h"
#include "qp_state.h"
#include "frame_channel.h"
#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;
using namespace vrdma::fabric_test;
using fabric::Link;
using fabric::LinkState;
using abi::CmdOp;

namespace {

constexpr const char* kKey = "the fabric key of the unit tests";
constexpr uint64_t kMiB = 1 << 20;

// One shim: an engine with one guest and the transport to the other shim.
struct Shim {
    Engine eng;
    const GuestIdentity& g;
    FakeProvider p;
    LinkTransport to_peer;
    fabric::TlsContext tls;
    Shim(const char* name, uint16_t lid, uint64_t guid) : g(eng.add_guest(name, lid, guid)), p(eng, g) {
        eng.set_clock(fake_clock);
    }
};

// What Fabric2 puts between the two Links.
struct Between {
    bool relay = false;     // a relay process in the middle (two socketpairs)
    long flip_at = -1;      // the relay changes byte N of the stream from A to B
    fabric::CryptoMode mode_a = fabric::CryptoMode::Encrypt, mode_b = fabric::CryptoMode::Encrypt;
    uint8_t instance_b = 0xb;
};

// Two shims joined by a pair of Links, directly or through a relay.
struct Fabric2 {
    Shim A{"a", 1, 0x1111};
    Shim B{"b", 2, 0x2222};
    Between between;
    UniqueFd relay_a, relay_b;  // the relay's ends: towards A, towards B
    long relayed_ab = 0;        // bytes the relay passed from A to B
    std::unique_ptr<Link> la, lb;  // declared after the engines: destroyed first

    explicit Fabric2(const char* key_b = kKey, Between b = {}) : between(b) {
        REQUIRE(make_tls(A.tls, kKey, b.mode_a));
        REQUIRE(make_tls(B.tls, key_b, b.mode_b));
        REQUIRE(A.eng.routes().add(2, 2, &A.to_peer));
        REQUIRE(B.eng.routes().add(1, 1, &B.to_peer));
        A.to_peer.routed_in = &A.eng;
        B.to_peer.routed_in = &B.eng;
        connect();
    }
    ~Fabric2() {
        A.to_peer.link = nullptr;
        B.to_peer.link = nullptr;
    }
    void connect() {
        int fds[2];
        REQUIRE(socket_pair(fds));
        int fa = fds[0], fb = fds[1];
        if (between.relay) {
            relay_a.reset(fds[1]);
            REQUIRE(socket_pair(fds));
            relay_b.reset(fds[0]);
            fb = fds[1];
        }
        A.to_peer.link = B.to_peer.link = nullptr;
        la = std::make_unique<Link>(A.eng, A.tls, UniqueFd(fa), true, instance(0xa), 1, 1, 0, "shim-b");
        lb = std::make_unique<Link>(B.eng, B.tls, UniqueFd(fb), false, instance(between.instance_b), 2, 2, 0,
                                    "shim-a");
        A.to_peer.link = la.get();
        B.to_peer.link = lb.get();
        pump();
    }
    uint64_t moved() const {
        uint64_t t = 0;
        for (const Link* l : {la.get(), lb.get()})
            if (l) t += l->stats.tx_bytes + l->stats.rx_bytes + l->stats.rx_msgs + l->stats.tx_msgs;
        return t;
    }
    // The relay: what arrived on one side goes out on the other (byte
    // flip_at of A's stream changed on the way).
    bool relay() {
        if (!relay_a) return false;
        bool moved_any = false;
        uint8_t buf[64 * 1024];
        for (int dir = 0; dir < 2; ++dir) {
            int from = dir == 0 ? relay_a.get() : relay_b.get(), to = dir == 0 ? relay_b.get() : relay_a.get();
            ssize_t r = ::read(from, buf, sizeof(buf));
            if (r == 0) ::shutdown(to, SHUT_WR);
            if (r <= 0) continue;
            if (dir == 0 && between.flip_at >= relayed_ab && between.flip_at < relayed_ab + r)
                buf[between.flip_at - relayed_ab] ^= 0x01;
            if (dir == 0) relayed_ab += r;
            REQUIRE(::send(to, buf, size_t(r), MSG_NOSIGNAL) == r);
            moved_any = true;
        }
        return moved_any;
    }
    // Runs both engines and both links until nothing moves.
    void pump(int max_rounds = 100000) {
        int quiet = 0;
        for (int i = 0; i < max_rounds && quiet < 3; ++i) {
            uint64_t before = moved();
            bool relayed = relay();
            bool p = A.eng.poll_once();
            p |= B.eng.poll_once();
            for (Link* l : {la.get(), lb.get()}) {
                if (!l || l->state() == LinkState::Closed) continue;
                l->flush();
                if (l->state() != LinkState::Closed) l->on_readable();
                l->take_became_up();
            }
            p |= moved() != before || relayed;
            quiet = p ? 0 : quiet + 1;
        }
    }
    bool up() const { return la->state() == LinkState::Up && lb->state() == LinkState::Up; }
};

// An RC QP of A connected to an RC QP of B, MRs of `mr_len` on both sides,
// one CQ each.
struct RcOverFabric : Fabric2 {
    uint32_t pd_a, pd_b;
    FakeProvider::CqView cq_a, cq_b;
    FakeProvider::QpView qa, qb;
    FakeProvider::MrInfo ma, mb;
    explicit RcOverFabric(uint64_t mr_len = 64 * 1024, uint8_t rnr_retry = 7, uint8_t retry_cnt = 7) {
        pd_a = A.p.pd();
        pd_b = B.p.pd();
        cq_a = A.p.cq(64);
        cq_b = B.p.cq(64);
        // A QP nobody uses first, so that the QPNs of the two shims differ.
        (void)B.p.qp(pd_b, cq_b, cq_b);
        qa = A.p.qp(pd_a, cq_a, cq_a);
        qb = B.p.qp(pd_b, cq_b, cq_b);
        REQUIRE(qa.qpn != qb.qpn);
        ma = A.p.mr(pd_a, mr_len, kAllAccess);
        mb = B.p.mr(pd_b, mr_len, kAllAccess);
        A.p.connect_rc(qa, 2, qb.qpn, kAllAccess, rnr_retry, retry_cnt);
        B.p.connect_rc(qb, 1, qa.qpn, kAllAccess, rnr_retry, retry_cnt);
    }
    // A new pair of connected QPs (the old ones stay as they are).
    void new_pair() {
        qa = A.p.qp(pd_a, cq_a, cq_a);
        qb = B.p.qp(pd_b, cq_b, cq_b);
        A.p.connect_rc(qa, 2, qb.qpn, kAllAccess);
        B.p.connect_rc(qb, 1, qa.qpn, kAllAccess);
    }
    // The incarnation of qa, which A's requests from it carry.
    uint64_t qa_incarnation() { return A.eng.qpns().find(1, qa.qpn).qp->incarnation; }
    uint8_t* pa(uint64_t off = 0) { return A.p.at(ma.addr + off); }
    uint8_t* pb(uint64_t off = 0) { return B.p.at(mb.addr + off); }
    abi::Sge sa(uint64_t off, uint32_t len) { return abi::Sge{ma.addr + off, len, ma.lkey}; }
    abi::Sge sb(uint64_t off, uint32_t len) { return abi::Sge{mb.addr + off, len, mb.lkey}; }
    void send_ok(uint64_t wr_id = 900) {
        B.p.post_recv(qb.rq, wr_id, {sb(0, 16)});
        std::memcpy(pa(0), "still-working", 13);
        A.p.post_send(qa.sq, send_wqe(wr_id, IBV_WR_SEND), {sa(0, 13)});
        pump();
        auto sc = A.p.poll(cq_a);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].wr_id == wr_id);
        CHECK(sc[0].status == IBV_WC_SUCCESS);
        auto rc = B.p.poll(cq_b);
        REQUIRE(rc.size() == 1);
        CHECK(rc[0].status == IBV_WC_SUCCESS);
        CHECK(rc[0].byte_len == 13);
        CHECK(std::memcmp(pb(0), "still-working", 13) == 0);
    }
};

void fill(uint8_t* p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) p[i] = uint8_t((i * 2654435761u + seed) >> 13);
}

// The header of a request's only segment, addressed as the request is
// (but from `src_lid`).
fabric::SegHeader request_header(const Request& req, uint16_t fixed_len, uint32_t payload_len, uint16_t src_lid) {
    fabric::SegHeader h{};
    h.type = uint8_t(fabric::SegType::Request);
    h.flags = fabric::kSegFirst | fabric::kSegLast;
    h.fixed_len = fixed_len;
    h.payload_len = payload_len;
    h.src_lid = src_lid;
    h.dst_lid = req.dlid;
    h.src_qpn = req.sqpn;
    h.dst_qpn = req.dqpn;
    h.psn = req.psn;
    return h;
}

// A request segment as a peer shim would write it: header, fixed part,
// payload.
std::vector<uint8_t> request_segment(const Request& req, const std::vector<uint8_t>& payload, uint16_t hdr_src_lid) {
    uint8_t fixed[fabric::kMaxFixed];
    const uint16_t fixed_len = fabric::encode(req, fixed);
    const fabric::SegHeader h = request_header(req, fixed_len, uint32_t(payload.size()), hdr_src_lid);
    std::vector<uint8_t> out(sizeof(h) + h.fixed_len + payload.size());
    std::memcpy(out.data(), &h, sizeof(h));
    std::memcpy(out.data() + sizeof(h), fixed, h.fixed_len);
    if (!payload.empty()) std::memcpy(out.data() + sizeof(h) + h.fixed_len, payload.data(), payload.size());
    return out;
}

TEST_CASE("fabric: the compact request carries every field; extensions only where they say something", "[shim][fabric]") {
    auto round_trip = [&](const Request& r, size_t want_len) {
        uint8_t fixed[fabric::kMaxFixed];
        const uint16_t len = fabric::encode(r, fixed);
        CHECK(len == want_len);
        const fabric::SegHeader h = request_header(r, len, 0, r.slid);
        const char* why = "";
        CHECK(fabric::header_ok(h, &why));
        Request d;
        REQUIRE(fabric::decode(h, fixed, d));
        CHECK(d.opcode == r.opcode);
        CHECK(d.qp_type == r.qp_type);
        CHECK(d.psn == r.psn);
        CHECK((d.slid == r.slid && d.dlid == r.dlid && d.sqpn == r.sqpn && d.dqpn == r.dqpn));
        CHECK((d.sl == r.sl && d.solicited == r.solicited && d.has_imm == r.has_imm && d.imm == r.imm));
        CHECK((d.length == r.length && d.rkey == r.rkey && d.remote_addr == r.remote_addr));
        CHECK((d.qkey == r.qkey && d.xrc_srqn == r.xrc_srqn && d.pkey == r.pkey));
        CHECK((d.src_incarnation == r.src_incarnation && d.dst_incarnation == r.dst_incarnation));
        CHECK((d.compare_add == r.compare_add && d.swap == r.swap));
        CHECK((d.grh == r.grh && d.traffic_class == r.traffic_class && d.hop_limit == r.hop_limit &&
               d.flow_label == r.flow_label));
        CHECK(std::memcmp(d.sgid, r.sgid, 16) == 0);
        CHECK(std::memcmp(d.dgid, r.dgid, 16) == 0);
        // Each flag bit that names an extension the bytes do not have, and
        // each length that is not the flags', is refused.
        for (uint8_t bit : {fabric::kReqOperands, fabric::kReqAddress}) {
            uint8_t bad[fabric::kMaxFixed];
            std::memcpy(bad, fixed, sizeof(bad));
            bad[offsetof(fabric::WireRequest, flags)] ^= bit;
            CHECK_FALSE(fabric::decode(h, bad, d));
        }
        fabric::SegHeader longer = h;
        longer.fixed_len = uint16_t(len == fabric::kMaxFixed ? sizeof(fabric::WireRequest) : fabric::kMaxFixed);
        CHECK_FALSE(fabric::decode(longer, fixed, d));
    };
    Request r;
    r.qp_type = IBV_QPT_RC;
    r.slid = 1;
    r.dlid = 2;
    r.sqpn = 0x123456;
    r.dqpn = 0xabcdef;
    r.psn = 0xfffffe;
    r.pkey = 0x8001;
    r.sl = 9;
    r.src_incarnation = 0x1111222233334444ull;
    r.dst_incarnation = 0x5555666677778888ull;
    SECTION("an RDMA WRITE with immediate: the 48-byte base alone") {
        r.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        r.has_imm = r.solicited = true;
        r.imm = 0xdeadbeef;
        r.length = kMaxMsgSize;
        r.rkey = 0x42;
        r.remote_addr = 0xfedcba9876543210ull;
        r.xrc_srqn = 77;
        round_trip(r, 48);
    }
    SECTION("an atomic: the operands follow") {
        r.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        r.length = 8;
        r.compare_add = 1;
        r.swap = ~0ull;
        round_trip(r, 64);
    }
    SECTION("a UD datagram through a global route: the address follows") {
        r.opcode = IBV_WR_SEND;
        r.qp_type = IBV_QPT_UD;
        r.qkey = 0x11111111;
        r.src_incarnation = r.dst_incarnation = 0;
        r.grh = true;
        r.traffic_class = 3;
        r.hop_limit = 64;
        r.flow_label = 0xfffff;
        for (int i = 0; i < 16; ++i) r.sgid[i] = uint8_t(i), r.dgid[i] = uint8_t(0xf0 | i);
        round_trip(r, 88);
    }
    SECTION("a rendezvous FIN: its headers in the address's place, no GRH") {
        r.opcode = kTmRndvFin;
        for (int i = 0; i < 16; ++i) r.sgid[i] = uint8_t(i + 1), r.dgid[i] = uint8_t(i + 2);
        round_trip(r, 88);
    }
    SECTION("both extensions") {
        r.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        r.length = 8;
        r.compare_add = 5;
        r.grh = true;
        r.hop_limit = 1;
        round_trip(r, fabric::kMaxFixed);
    }
}

// A UD QP notice (SegType::UdQp) as a peer shim would write it.
std::vector<uint8_t> ud_qp_notice(uint16_t lid, uint32_t qpn, uint64_t guid) {
    fabric::SegHeader h{};
    h.type = uint8_t(fabric::SegType::UdQp);
    h.flags = fabric::kSegFirst | fabric::kSegLast;
    h.src_lid = lid;
    h.src_qpn = qpn;
    h.offset = guid;
    std::vector<uint8_t> v(sizeof(h));
    std::memcpy(v.data(), &h, sizeof(h));
    return v;
}

// Writes raw bytes into the stream from A to B (A's link is idle, so they
// arrive at a segment boundary).
void inject(Fabric2& f, const std::vector<uint8_t>& bytes) {
    REQUIRE(f.la->wants_write() == false);
    REQUIRE(f.la->write_unframed(bytes.data(), bytes.size()) == bytes.size());
}

// A listening Link (lids 1-1, as `me` says otherwise) over a socketpair,
// and a TLS client at the other end keyed with `peer_key`: the peer's side
// is played by hand (peer_handshake).
struct HandPlayedPeer {
    Engine eng;
    fabric::TlsContext tls, peer_tls;
    UniqueFd peer;
    std::unique_ptr<Link> link;
    std::unique_ptr<fabric::TlsChannel> ch;
    explicit HandPlayedPeer(const char* peer_key = kKey, fabric::LinkIdentity me = {}) {
        REQUIRE(make_tls(tls, kKey));
        REQUIRE(make_tls(peer_tls, peer_key));
        int fds[2];
        REQUIRE(socket_pair(fds));
        peer.reset(fds[1]);
        me.instance = instance(1);
        me.lid_first = me.lid_last = 1;
        link = std::make_unique<Link>(eng, tls, UniqueFd(fds[0]), false, me, "peer");
        ch = std::make_unique<fabric::TlsChannel>(peer_tls, peer.get(), true);
    }
    void pump() {
        link->flush();
        link->on_readable();
    }
    bool handshake(const fabric::Hello& h, fabric::Hello* theirs = nullptr) {
        return peer_handshake(*ch, h, [this] { pump(); }, theirs);
    }
};

}  // namespace

TEST_CASE("fabric: the handshake needs the same key on both sides", "[shim][fabric]") {
    SECTION("same key: both links up, each knows the other's LIDs") {
        Fabric2 f;
        REQUIRE(f.up());
        CHECK(f.la->peer_hello().lid_first == 2);
        CHECK(f.la->peer_hello().lid_last == 2);
        CHECK(f.lb->peer_hello().lid_first == 1);
        CHECK(f.la->peer_owns(2));
        CHECK_FALSE(f.la->peer_owns(1));
        CHECK_FALSE(f.la->auth_failed());
        CHECK_FALSE(f.lb->auth_failed());
        // The Hello and the guest's partitions each way through the channel, nothing else.
        CHECK(f.la->stats.tx_bytes == sizeof(fabric::Hello) + sizeof(fabric::SegHeader) + 2);
        CHECK(f.lb->stats.rx_bytes == sizeof(fabric::Hello) + sizeof(fabric::SegHeader) + 2);
    }
    SECTION("another key: both sides refuse (auth_failed), nothing is routed") {
        Fabric2 f("another fabric key, not the same");
        CHECK(f.la->state() == LinkState::Closed);
        CHECK(f.lb->state() == LinkState::Closed);
        CHECK(f.la->auth_failed());
        CHECK(f.lb->auth_failed());
        CHECK(f.la->close_reason().find("authentication failed") != std::string::npos);
        CHECK(f.la->stats.errors == 1);
    }
    SECTION("another crypto mode: both sides refuse, and say why") {
        Between b;
        b.mode_b = fabric::CryptoMode::Integrity;
        Fabric2 f(kKey, b);
        CHECK(f.la->state() == LinkState::Closed);
        CHECK(f.lb->state() == LinkState::Closed);
        CHECK(f.la->mode_mismatch());
        CHECK(f.lb->mode_mismatch());
        CHECK_FALSE(f.la->auth_failed());
        CHECK(f.la->close_reason().find("--fabric-crypto integrity") != std::string::npos);
        CHECK(f.lb->close_reason().find("--fabric-crypto encrypt") != std::string::npos);
    }
    SECTION("both ends with one instance id: a shim connected to itself") {
        Between b;
        b.instance_b = 0xa;
        Fabric2 f(kKey, b);
        CHECK(f.la->state() == LinkState::Closed);
        CHECK(f.la->close_reason().find("connected to itself") != std::string::npos);
    }
    SECTION("a peer with another key is refused by the TLS handshake") {
        HandPlayedPeer t("0123456789abcdef0123");
        CHECK_FALSE(t.handshake(make_hello(2, 2)));
        t.pump();
        CHECK(t.link->state() == LinkState::Closed);
        CHECK(t.link->auth_failed());
    }
    SECTION("a Hello with impossible worker numbers is a protocol violation") {
        for (int bad = 0; bad < 3; ++bad) {
            CAPTURE(bad);
            HandPlayedPeer t;
            fabric::Hello h = make_hello(2, 2);
            if (bad == 0) h.workers = 0;                              // no worker at all
            if (bad == 1) h.worker = 3;                               // its worker 3 of 1
            if (bad == 2) h.workers = fabric::kMaxFabricWorkers + 1;  // more than a shim may run
            t.handshake(h);
            t.pump();
            CHECK(t.link->state() == LinkState::Closed);
            CHECK(t.link->close_reason().find("invalid worker numbers") != std::string::npos);
        }
    }
    SECTION("a held link reads nothing after the Hellos until it is released") {
        fabric::LinkIdentity me;
        me.worker = me.target = fabric::kAnyWorker;
        me.hold = true;
        HandPlayedPeer t(kKey, me);
        fabric::Hello theirs{};
        REQUIRE(t.handshake(make_hello(2, 2), &theirs));
        t.pump();
        CHECK(theirs.worker == fabric::kAnyWorker);
        CHECK(theirs.target == fabric::kAnyWorker);
        REQUIRE(t.link->state() == LinkState::Up);
        // Bytes after the Hello stay in the socket while the link is held:
        // they would otherwise be read into the engine of the wrong worker.
        uint8_t junk[64];
        std::memset(junk, 0xee, sizeof(junk));  // no segment type
        auto frames = peer_frames(*t.ch, t.peer.get(), fabric::CryptoMode::Encrypt, true);
        REQUIRE(frames->write(junk, sizeof(junk)) > 0);
        REQUIRE(frames->flush_output() >= 0);
        for (int i = 0; i < 10; ++i) t.pump();
        CHECK(t.link->state() == LinkState::Up);
        CHECK(t.link->stats.rx_bytes == sizeof(fabric::Hello));
        // Released, it reads them (and here finds garbage: a violation).
        t.link->release(t.eng, nullptr);
        for (int i = 0; i < 10 && t.link->state() == LinkState::Up; ++i) t.pump();
        CHECK(t.link->state() == LinkState::Closed);
    }
}

TEST_CASE("fabric: a relay that changes one byte is refused or cut, in both modes", "[shim][fabric]") {
    for (auto mode : {fabric::CryptoMode::Encrypt, fabric::CryptoMode::Integrity}) {
        CAPTURE(fabric::crypto_mode_name(mode));
        SECTION(std::string("a relay that changes nothing: up, ") + fabric::crypto_mode_name(mode)) {
            Between b;
            b.relay = true;
            b.mode_a = b.mode_b = mode;
            Fabric2 f(kKey, b);
            CHECK(f.up());
        }
        SECTION(std::string("a byte of the handshake changed: both refuse, ") + fabric::crypto_mode_name(mode)) {
            Between b;
            b.relay = true;
            b.flip_at = 60;  // inside the ClientHello
            b.mode_a = b.mode_b = mode;
            Fabric2 f(kKey, b);
            CHECK(f.la->state() == LinkState::Closed);
            CHECK(f.lb->state() == LinkState::Closed);
            CHECK(f.lb->auth_failed());
        }
        SECTION(std::string("a byte after the handshake changed: the link is cut as tampered, ") +
                fabric::crypto_mode_name(mode)) {
            Between b;
            b.relay = true;
            b.mode_a = b.mode_b = mode;
            Fabric2 f(kKey, b);
            REQUIRE(f.up());
            f.between.flip_at = f.relayed_ab + 10;
            const uint8_t junk[64] = {};
            REQUIRE(f.la->write_unframed(junk, sizeof(junk)) == sizeof(junk));
            f.pump();
            CHECK(f.lb->state() == LinkState::Closed);
            CHECK(f.lb->tampered());
            CHECK(f.lb->close_reason().find("failed authentication") != std::string::npos);
        }
    }
}

namespace {
// Two frame channels over a socket pair in one mode, each sending with the
// keys the other receives with: the sender on a, the receiver on b. Test
// keys: generation g of a direction is its seed plus g in every byte.
std::array<int, 2> connected_pair() {
    int fds[2] = {-1, -1};
    REQUIRE(socket_pair(fds));
    return {fds[0], fds[1]};
}
fabric::FrameKeySource test_keys(uint8_t seed) {
    return [seed](uint64_t generation, fabric::FrameKeys& k) {
        std::memset(&k, 0, sizeof(k));
        for (size_t i = 0; i < sizeof(k.key); ++i) k.key[i] = uint8_t(seed + i + generation);
        k.iv[0] = uint8_t(generation);
        return true;
    };
}
struct FramePair {
    explicit FramePair(fabric::CryptoMode mode) : FramePair(mode, connected_pair()) {}
    FramePair(fabric::CryptoMode mode, std::array<int, 2> fds)
        : a(fds[0]),
          b(fds[1]),
          sender(a.get(), mode, test_keys(0), test_keys(100)),
          receiver(b.get(), mode, test_keys(100), test_keys(0)) {}
    UniqueFd a, b;
    fabric::FrameChannel sender, receiver;
};
}  // namespace

TEST_CASE("fabric: frames move to new keys every so many frames, on both ends, and the data arrives whole",
          "[shim][fabric]") {
    auto mode = GENERATE(fabric::CryptoMode::Encrypt, fabric::CryptoMode::Integrity);
    CAPTURE(fabric::crypto_mode_name(mode));
    FramePair p(mode);
    p.sender.set_frames_per_key(4);
    p.receiver.set_frames_per_key(4);
    std::vector<uint8_t> data(1 << 20), got(data.size());
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + i / 4096);
    size_t sent = 0, received = 0;
    for (int rounds = 0; received < data.size() && rounds < 100000; ++rounds) {
        if (sent < data.size()) {
            const ssize_t w = p.sender.write(data.data() + sent, std::min<size_t>(16384, data.size() - sent));
            REQUIRE(w >= 0);
            sent += size_t(w);
        }
        REQUIRE(p.sender.flush_output() >= 0);
        const ssize_t r = p.receiver.read(got.data() + received, got.size() - received);
        REQUIRE(r >= 0);
        received += size_t(r);
    }
    REQUIRE(received == data.size());
    CHECK(got == data);
    CHECK(p.sender.send_generation() == 64 / 4);  // 64 frames of 16 KiB
    CHECK(p.receiver.recv_generation() == 64 / 4);
}

TEST_CASE("fabric: a frame sealed under the old keys after the change fails", "[shim][fabric]") {
    auto mode = GENERATE(fabric::CryptoMode::Encrypt, fabric::CryptoMode::Integrity);
    CAPTURE(fabric::crypto_mode_name(mode));
    FramePair p(mode);
    p.sender.set_frames_per_key(4);  // the receiver changes keys one frame later
    p.receiver.set_frames_per_key(5);
    char buf[32] = "frame";
    for (int i = 0; i < 5; ++i) REQUIRE(p.sender.write(buf, sizeof(buf)) == ssize_t(sizeof(buf)));
    REQUIRE(p.sender.flush_output() == 1);
    char got[64];
    for (int i = 0; i < 4; ++i) REQUIRE(p.receiver.read(got, sizeof(got)) == ssize_t(sizeof(buf)));
    CHECK(p.receiver.read(got, sizeof(got)) == -1);
    CHECK(p.receiver.tampered());
}

TEST_CASE("fabric: encrypted frames carry no byte of the data in clear; integrity frames carry it as it is",
          "[shim][fabric]") {
    auto mode = GENERATE(fabric::CryptoMode::Encrypt, fabric::CryptoMode::Integrity);
    CAPTURE(fabric::crypto_mode_name(mode));
    FramePair p(mode);
    const std::string secret = "a guest's secret, 40 bytes long ........";
    REQUIRE(p.sender.write(secret.data(), secret.size()) == ssize_t(secret.size()));
    REQUIRE(p.sender.flush_output() == 1);
    std::vector<uint8_t> wire(4096);
    const ssize_t n = ::read(p.b.get(), wire.data(), wire.size());
    REQUIRE(size_t(n) == fabric::kFrameHeaderBytes + secret.size() + fabric::kFrameTagBytes);
    const std::string body(reinterpret_cast<const char*>(wire.data()) + fabric::kFrameHeaderBytes, secret.size());
    if (mode == fabric::CryptoMode::Encrypt) {
        CHECK(body != secret);
        CHECK(body.find("secret") == std::string::npos);
    } else {
        CHECK(body == secret);
    }
}

TEST_CASE("fabric: frames: memory changed after the write does not make its frame fail", "[shim][fabric]") {
    auto mode = GENERATE(fabric::CryptoMode::Encrypt, fabric::CryptoMode::Integrity);
    CAPTURE(fabric::crypto_mode_name(mode));
    FramePair p(mode);
    fabric::FrameChannel &sender = p.sender, &receiver = p.receiver;
    // A guest's buffer, taken by the channel, then rewritten by the guest
    // before the frame went out (the link sends at the end of its flush).
    char buf[] = "the bytes as they were when taken";
    const std::string taken = buf;
    REQUIRE(sender.write(buf, sizeof(buf)) == ssize_t(sizeof(buf)));
    std::memset(buf, 'X', sizeof(buf) - 1);
    REQUIRE(sender.flush_output() == 1);
    char got[64];
    REQUIRE(receiver.read(got, sizeof(got)) == ssize_t(sizeof(buf)));
    CHECK(std::string(got) == taken);
    CHECK_FALSE(receiver.tampered());
}

TEST_CASE("fabric: frames: a replayed, reordered, cut or oversized frame fails", "[shim][fabric]") {
    auto mode = GENERATE(fabric::CryptoMode::Encrypt, fabric::CryptoMode::Integrity);
    CAPTURE(fabric::crypto_mode_name(mode));
    FramePair p(mode);
    UniqueFd &a = p.a, &b = p.b;
    fabric::FrameChannel &sender = p.sender, &receiver = p.receiver;
    const char one[] = "first frame", two[] = "second frame";
    // The frames as they go on the wire (read back raw, then replayed by hand).
    REQUIRE(sender.write(one, sizeof(one)) == ssize_t(sizeof(one)));
    REQUIRE(sender.write(two, sizeof(two)) == ssize_t(sizeof(two)));
    // Sealed, not sent: the frames leave together.
    CHECK(sender.output_pending());
    char none;
    CHECK(::recv(b.get(), &none, 1, MSG_DONTWAIT) == -1);
    REQUIRE(sender.flush_output() == 1);
    CHECK_FALSE(sender.output_pending());
    std::vector<uint8_t> wire(4096);
    const ssize_t n = ::read(b.get(), wire.data(), wire.size());
    const size_t f1 = 4 + sizeof(one) + fabric::kFrameTagBytes;
    REQUIRE(size_t(n) == f1 + 4 + sizeof(two) + fabric::kFrameTagBytes);
    wire.resize(size_t(n));
    auto deliver = [&](const std::vector<uint8_t>& bytes) {
        REQUIRE(::send(a.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size()));
    };
    char got[64];
    SECTION("in order: both frames, byte for byte") {
        deliver(wire);
        REQUIRE(receiver.read(got, sizeof(got)) == ssize_t(sizeof(one)));
        CHECK(std::memcmp(got, one, sizeof(one)) == 0);
        REQUIRE(receiver.read(got, sizeof(got)) == ssize_t(sizeof(two)));
        CHECK(std::memcmp(got, two, sizeof(two)) == 0);
        CHECK(receiver.read(got, sizeof(got)) == 0);  // nothing more: not now
    }
    SECTION("the first frame replayed after it: the copy fails") {
        std::vector<uint8_t> v(wire.begin(), wire.begin() + long(f1));
        v.insert(v.end(), wire.begin(), wire.begin() + long(f1));
        deliver(v);
        REQUIRE(receiver.read(got, sizeof(got)) == ssize_t(sizeof(one)));
        CHECK(receiver.read(got, sizeof(got)) == -1);
        CHECK(receiver.tampered());
    }
    SECTION("the second frame first: it fails") {
        std::vector<uint8_t> v(wire.begin() + long(f1), wire.end());
        deliver(v);
        CHECK(receiver.read(got, sizeof(got)) == -1);
        CHECK(receiver.tampered());
    }
    SECTION("a length over 64 KiB: it fails before waiting for the bytes") {
        std::vector<uint8_t> v = wire;
        const uint32_t big = fabric::kMaxFrameData + 1;
        std::memcpy(v.data(), &big, 4);
        deliver(v);
        CHECK(receiver.read(got, sizeof(got)) == -1);
        CHECK(receiver.tampered());
    }
    SECTION("a frame cut short, then the connection closed: no byte of it is handed on") {
        std::vector<uint8_t> v(wire.begin(), wire.begin() + long(f1) - 1);
        deliver(v);
        CHECK(receiver.read(got, sizeof(got)) == 0);
        ::shutdown(a.get(), SHUT_WR);
        CHECK(receiver.read(got, sizeof(got)) == -1);
        CHECK(receiver.closed());
        CHECK_FALSE(receiver.tampered());
    }
}

TEST_CASE("fabric: RDMA write of 1 MiB goes in 64 KiB segments", "[shim][fabric]") {
    RcOverFabric t(kMiB + 4096);
    fill(t.pa(0), kMiB, 1);
    std::memset(t.pb(0), 0xee, kMiB + 4096);
    const uint64_t tx0 = t.la->stats.tx_bytes, rx0 = t.la->stats.rx_bytes;
    auto w = send_wqe(1, IBV_WR_RDMA_WRITE);
    w.remote_addr = t.mb.addr + 4096;
    w.rkey = t.mb.rkey;
    t.A.p.post_send(t.qa.sq, w, {t.sa(0, kMiB / 2), t.sa(kMiB / 2, kMiB / 2)});
    t.pump();
    CHECK(std::memcmp(t.pa(0), t.pb(4096), kMiB) == 0);
    CHECK(t.pb(4095)[0] == 0xee);  // nothing before the target range
    // 16 segments of 64 KiB: 16 headers, one fixed part; the ACK back.
    CHECK(t.la->stats.tx_bytes - tx0 == kMiB + 16 * sizeof(fabric::SegHeader) + sizeof(fabric::WireRequest));
    CHECK(t.la->stats.rx_bytes - rx0 == sizeof(fabric::SegHeader) + sizeof(fabric::WireResponse));
    auto sc = t.A.p.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].wr_id == 1);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[0].opcode == IBV_WC_RDMA_WRITE);
    CHECK(sc[0].byte_len == kMiB);
    CHECK(sc[0].qp_num == t.qa.qpn);
    CHECK(sc[0].wc_flags == 0);
    CHECK(t.B.p.poll(t.cq_b).empty());  // a plain write is invisible to the responder

    // With immediate: the receive completion carries it.
    t.B.p.post_recv(t.qb.rq, 42, {});
    w = send_wqe(2, IBV_WR_RDMA_WRITE_WITH_IMM);
    w.remote_addr = t.mb.addr + 100;
    w.rkey = t.mb.rkey;
    w.imm_data = htonl(7);
    t.A.p.post_send(t.qa.sq, w, {t.sa(0, 70000)});
    t.pump();
    CHECK(std::memcmp(t.pb(100), t.pa(0), 70000) == 0);
    auto rc = t.B.p.poll(t.cq_b);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].wr_id == 42);
    CHECK(rc[0].status == IBV_WC_SUCCESS);
    CHECK(rc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(rc[0].byte_len == 70000);
    CHECK(rc[0].wc_flags == IBV_WC_WITH_IMM);
    CHECK(rc[0].imm_data == htonl(7));
    CHECK(rc[0].src_qp == t.qa.qpn);
    CHECK(rc[0].slid == 1);
    sc = t.A.p.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].opcode == IBV_WC_RDMA_WRITE);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
}

TEST_CASE("fabric: a delayed ACK rides on the answer; alone it leaves when due or when it covers 16 messages",
          "[shim][fabric]") {
    RcOverFabric t;
    // Long enough that only what the test does releases an ACK.
    t.la->set_ack_delay(60'000'000'000ull);
    t.lb->set_ack_delay(60'000'000'000ull);

    // Ping: B's receive completes; A's send waits for its ACK, held by B.
    t.B.p.post_recv(t.qb.rq, 1, {t.sb(0, 16)});
    std::memcpy(t.pa(0), "ping", 4);
    t.A.p.post_send(t.qa.sq, send_wqe(10, IBV_WR_SEND), {t.sa(0, 4)});
    t.pump();
    auto rc = t.B.p.poll(t.cq_b);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].byte_len == 4);
    CHECK(t.A.p.poll(t.cq_a).empty());
    CHECK(t.lb->ack_due_ns() != 0);

    // Pong: B's answer carries the ACK, so A's send completes with it.
    t.A.p.post_recv(t.qa.rq, 2, {t.sa(100, 16)});
    std::memcpy(t.pb(200), "pong", 4);
    t.B.p.post_send(t.qb.sq, send_wqe(20, IBV_WR_SEND, 0), {t.sb(200, 4)});
    t.pump();
    CHECK(t.lb->ack_due_ns() == 0);
    rc = t.A.p.poll(t.cq_a);
    REQUIRE(rc.size() == 2);
    for (auto& c : rc) CHECK(c.status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(t.pa(100), "pong", 4) == 0);
    CHECK(t.la->ack_due_ns() != 0);  // A holds the ACK of the pong now

    // With nothing to ride on, an ACK leaves when its time is up...
    t.lb->release_due_acks(t.la->ack_due_ns() - 1);  // (B holds none: nothing happens)
    t.la->release_due_acks(t.la->ack_due_ns());
    t.pump();
    CHECK(t.la->ack_due_ns() == 0);
    CHECK(t.B.p.poll(t.cq_b).empty());  // B's pong was unsignaled: no completion, but its slot is free

    // ... or when it acknowledges 16 messages: 15 writes wait, the 16th
    // releases one cumulative ACK of all of them.
    for (uint64_t i = 0; i < fabric::Link::kAckDelayMaxMessages; ++i) {
        auto w = send_wqe(100 + i, IBV_WR_RDMA_WRITE);
        w.remote_addr = t.mb.addr + 1024 + 8 * i;
        w.rkey = t.mb.rkey;
        t.A.p.post_send(t.qa.sq, w, {t.sa(0, 8)});
        t.pump();
        if (i + 1 < fabric::Link::kAckDelayMaxMessages) {
            CHECK(t.A.p.poll(t.cq_a).empty());
        }
    }
    auto sc = t.A.p.poll(t.cq_a);
    REQUIRE(sc.size() == fabric::Link::kAckDelayMaxMessages);
    for (size_t i = 0; i < sc.size(); ++i) {
        CHECK(sc[i].wr_id == 100 + i);
        CHECK(sc[i].status == IBV_WC_SUCCESS);
    }
    CHECK(t.lb->ack_due_ns() == 0);
}

TEST_CASE("fabric: RDMA read of 200 KiB", "[shim][fabric]") {
    constexpr uint32_t kLen = 200 * 1024;
    RcOverFabric t(256 * 1024);
    fill(t.pb(1000), kLen, 2);
    std::memset(t.pa(0), 0, 256 * 1024);
    const uint64_t rx0 = t.la->stats.rx_bytes;
    auto w = send_wqe(3, IBV_WR_RDMA_READ);
    w.remote_addr = t.mb.addr + 1000;
    w.rkey = t.mb.rkey;
    t.A.p.post_send(t.qa.sq, w, {t.sa(0, 100000), t.sa(150000, kLen - 100000)});
    t.pump();
    CHECK(std::memcmp(t.pa(0), t.pb(1000), 100000) == 0);
    CHECK(std::memcmp(t.pa(150000), t.pb(1000 + 100000), kLen - 100000) == 0);
    CHECK(t.pa(100000)[0] == 0);  // the gap between the SGEs
    // The response: 4 segments (64+64+64+8 KiB), one fixed part.
    CHECK(t.la->stats.rx_bytes - rx0 == kLen + 4 * sizeof(fabric::SegHeader) + sizeof(fabric::WireResponse));
    auto sc = t.A.p.poll(t.cq_a);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].wr_id == 3);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[0].opcode == IBV_WC_RDMA_READ);
    CHECK(sc[0].byte_len == kLen);
    CHECK(sc[0].qp_num == t.qa.qpn);
    CHECK(sc[0].wc_flags == 0);
    CHECK(t.B.p.poll(t.cq_b).empty());
}

// A UD QP of A and one of B (qkey 0x1234), an MR and a CQ on each side.
struct UdOverFabric : Fabric2 {
    uint32_t pa = 0, pb = 0;
    FakeProvider::CqView ca, cb;
    FakeProvider::QpView qa, qb;
    FakeProvider::MrInfo ma, mb;
    UdOverFabric() {
        pa = A.p.pd();
        pb = B.p.pd();
        ca = A.p.cq(64);
        cb = B.p.cq(64);
        FakeProvider::QpSpec ud;
        ud.type = IBV_QPT_UD;
        (void)B.p.qp(pb, cb, cb, ud);  // QPNs differ between the shims
        qa = A.p.qp(pa, ca, ca, ud);
        qb = B.p.qp(pb, cb, cb, ud);
        A.p.ud_ready(qa, 0x1234);
        B.p.ud_ready(qb, 0x1234);
        ma = A.p.mr(pa, 8192, kAllAccess);
        mb = B.p.mr(pb, 8192, kAllAccess);
    }
    // An AH of A's PD to `attr`'s destination (dlid 2, port 1 if unset).
    uint32_t ah(abi::AhAttr attr = {}) {
        abi::CmdCreateAhReq r{};
        r.pd_handle = pa;
        r.attr = attr;
        if (!r.attr.dlid) r.attr.dlid = 2;
        if (!r.attr.port_num) r.attr.port_num = 1;
        return A.p.cmd(CmdOp::CreateAh, r).as<abi::CmdCreateAhResp>().ah_handle;
    }
};

// A guest of shim A guesses the qkey of a UD QP on shim B: B counts the
// guesses and throttles the pair (A's guest's LID, B's guest), as it would a
// guest of its own; a second later the right qkey passes again.
TEST_CASE("fabric: a peer's guest that keeps guessing qkeys is counted and throttled", "[shim][fabric][isolation]") {
    UdOverFabric f;
    f.B.eng.qkey_throttle().set_limit(4);  // 4 at once, then 4 a second
    const uint32_t ah = f.ah();
    const GuestSecurity& s = f.B.eng.guests().security_of(f.B.g);
    f.B.p.post_recv(f.qb.rq, 1, {abi::Sge{f.mb.addr, 100, f.mb.lkey}});
    // n datagrams from A's QP with qkeys first_qkey, first_qkey + 1, ...
    auto send = [&](uint32_t first_qkey, int n) {
        for (int i = 0; i < n; ++i) {
            auto w = send_wqe(uint64_t(i), IBV_WR_SEND);
            w.ah_handle = ah;
            w.remote_qpn = f.qb.qpn;
            w.remote_qkey = first_qkey + uint32_t(i);
            f.A.p.post_send(f.qa.sq, w, {abi::Sge{f.ma.addr, 8, f.ma.lkey}});
        }
        f.pump();
        CHECK(f.A.p.poll(f.ca).size() == size_t(n));
    };
    send(0x5000, 10);  // the right one is 0x1234
    CHECK(s.qkey_violations == 4);
    CHECK(s.throttled_datagrams == 6);
    send(0x1234, 1);
    CHECK(s.throttled_datagrams == 7);
    CHECK(f.B.p.poll(f.cb).empty());
    CHECK(f.B.eng.qkey_throttle().throttled(GuessThrottle::pair(1, 2), f.B.eng.now()));
    g_fake_now += 1'000'000'000;
    send(0x1234, 1);
    auto rc = f.B.p.poll(f.cb);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].status == IBV_WC_SUCCESS);
    CHECK(rc[0].slid == 1);
}

TEST_CASE("fabric: UD datagram with a GRH", "[shim][fabric]") {
    UdOverFabric f;
    abi::AhAttr grh{};
    grh.sl = 5;
    grh.is_global = 1;
    grh.hop_limit = 64;
    grh.traffic_class = 0x28;
    grh.flow_label = 0x12345;
    make_gid(0x2222, grh.dgid);
    const uint32_t ah = f.ah(grh);
    auto &ca = f.ca, &cb = f.cb;
    auto &qa = f.qa, &qb = f.qb;
    auto &ma = f.ma, &mb = f.mb;

    std::memcpy(f.A.p.at(ma.addr), "datagram", 8);
    std::memset(f.B.p.at(mb.addr), 0xee, 200);
    f.B.p.post_recv(qb.rq, 1, {abi::Sge{mb.addr, 100, mb.lkey}});
    auto w = send_wqe(10, IBV_WR_SEND_WITH_IMM);
    w.ah_handle = ah;
    w.remote_qpn = qb.qpn;
    w.remote_qkey = 0x1234;
    w.imm_data = htonl(99);
    f.A.p.post_send(qa.sq, w, {abi::Sge{ma.addr, 8, ma.lkey}});
    f.pump();

    auto sc = f.A.p.poll(ca);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].wr_id == 10);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[0].opcode == IBV_WC_SEND);
    CHECK(sc[0].byte_len == 8);
    CHECK(sc[0].qp_num == qa.qpn);
    auto rc = f.B.p.poll(cb);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].wr_id == 1);
    CHECK(rc[0].status == IBV_WC_SUCCESS);
    CHECK(rc[0].opcode == IBV_WC_RECV);
    CHECK(rc[0].byte_len == 48);
    CHECK(rc[0].qp_num == qb.qpn);
    CHECK(rc[0].src_qp == qa.qpn);
    CHECK(rc[0].slid == 1);
    CHECK(rc[0].sl == 5);
    CHECK(rc[0].wc_flags == (IBV_WC_WITH_IMM | IBV_WC_GRH));
    CHECK(rc[0].imm_data == htonl(99));
    const uint8_t* g = f.B.p.at(mb.addr);
    uint32_t vtf;
    std::memcpy(&vtf, g, 4);
    vtf = ntohl(vtf);
    CHECK(vtf >> 28 == 6);
    CHECK(((vtf >> 20) & 0xff) == 0x28);
    CHECK((vtf & 0xfffff) == 0x12345);
    CHECK(g[4] == 0);
    CHECK(g[5] == 8);      // payload length
    CHECK(g[6] == 0x1b);   // next header
    CHECK(g[7] == 64);     // hop limit
    uint8_t sgid[16];
    make_gid(0x1111, sgid);
    CHECK(std::memcmp(g + 8, sgid, 16) == 0);
    CHECK(std::memcmp(g + 24, grh.dgid, 16) == 0);
    CHECK(std::memcmp(g + 40, "datagram", 8) == 0);
    CHECK(g[48] == 0xee);
    CHECK(f.la->stats.errors == 0);
    CHECK(f.lb->stats.errors == 0);
    CHECK(f.lb->stats.tx_msgs == 0);  // no response to a datagram
}

TEST_CASE("fabric: a closed link gives RETRY_EXC_ERR after the QP's timeout", "[shim][fabric]") {
    RcOverFabric t(64 * 1024, 7, /*retry_cnt=*/2);
    t.B.p.post_recv(t.qb.rq, 9, {t.sb(0, 16)});
    t.B.to_peer.link = nullptr;
    t.lb.reset();  // shim B goes away
    t.pump();
    CHECK(t.la->state() == LinkState::Closed);
    CHECK(t.la->close_reason() == "the peer closed the connection");
    t.A.p.post_send(t.qa.sq, send_wqe(1, IBV_WR_SEND), {t.sa(0, 4)});
    t.A.p.post_send(t.qa.sq, send_wqe(2, IBV_WR_SEND, 0), {t.sa(0, 4)});
    t.pump();
    const uint64_t timeout = ack_timeout_ns(14);  // RcPath of the harness
    // The first send and retry_cnt (2) resends, each given the timeout.
    for (int i = 0; i < 3; ++i) {
        CHECK(t.A.p.poll(t.cq_a).empty());
        g_fake_now += timeout - 1;
        t.pump();
        CHECK(t.A.p.poll(t.cq_a).empty());
        g_fake_now += 1;
        t.pump();
    }
    auto sc = t.A.p.poll(t.cq_a);
    REQUIRE(sc.size() == 2);
    CHECK(sc[0].wr_id == 1);
    CHECK(sc[0].status == IBV_WC_RETRY_EXC_ERR);
    CHECK(sc[0].opcode == IBV_WC_SEND);
    CHECK(sc[0].qp_num == t.qa.qpn);
    CHECK(sc[1].wr_id == 2);
    CHECK(sc[1].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(t.A.p.qp_state(t.qa.handle) == IBV_QPS_ERR);
}

TEST_CASE("fabric: a malformed segment closes the link; the engine keeps working", "[shim][fabric]") {
    struct Case {
        const char* why;
        std::function<std::vector<uint8_t>(RcOverFabric&)> bytes;
    };
    auto header = [](uint8_t type, uint8_t flags, uint16_t fixed, uint32_t payload) {
        fabric::SegHeader h{};
        h.type = type;
        h.flags = flags;
        h.fixed_len = fixed;
        h.payload_len = payload;
        h.src_lid = 1;
        h.dst_lid = 2;
        std::vector<uint8_t> v(sizeof(h));
        std::memcpy(v.data(), &h, sizeof(h));
        return v;
    };
    const uint8_t both = fabric::kSegFirst | fabric::kSegLast;
    const Case cases[] = {
        {"unknown segment type", [&](RcOverFabric&) { return header(9, both, 0, 0); }},
        {"segment payload over 64 KiB", [&](RcOverFabric&) { return header(1, both, 112, 65537); }},
        {"wrong fixed part length", [&](RcOverFabric&) { return header(1, both, 100, 0); }},
        {"malformed UD QP notice", [&](RcOverFabric&) { return header(5, both, 0, 8); }},
        {"a continuation of no message", [&](RcOverFabric&) { return header(1, fabric::kSegLast, 0, 10); }},
        {"malformed request",
         [&](RcOverFabric& t) {
             Request r;
             r.opcode = 99;
             r.qp_type = IBV_QPT_RC;
             r.slid = 1;
             r.dlid = 2;
             r.sqpn = t.qa.qpn;
             r.src_incarnation = t.qa_incarnation();
             r.dqpn = t.qb.qpn;
             return request_segment(r, {}, 1);
         }},
        {"a message shorter than announced",
         [&](RcOverFabric& t) {
             Request r;
             r.opcode = IBV_WR_RDMA_WRITE;
             r.qp_type = IBV_QPT_RC;
             r.slid = 1;
             r.dlid = 2;
             r.sqpn = t.qa.qpn;
             r.src_incarnation = t.qa_incarnation();
             r.dqpn = t.qb.qpn;
             r.rkey = t.mb.rkey;
             r.remote_addr = t.mb.addr;
             r.length = 100;
             return request_segment(r, std::vector<uint8_t>(50, 0xab), 1);  // flagged last
         }},
    };
    for (const Case& c : cases) {
        DYNAMIC_SECTION(c.why) {
            RcOverFabric t;
            std::memset(t.pb(0), 0x11, 64 * 1024);
            inject(t, c.bytes(t));
            t.pump();
            CHECK(t.lb->state() == LinkState::Closed);
            CHECK(t.lb->close_reason() == std::string("protocol violation: ") + c.why);
            CHECK(t.lb->stats.errors >= 1);
            CHECK(t.la->state() == LinkState::Closed);  // it saw the connection close
            // B's memory got nothing but what a valid request may write (the
            // short WRITE's first 50 bytes: its rkey was valid).
            std::vector<uint8_t> want(64 * 1024, 0x11);
            const bool cut = std::string(c.why) == "a message shorter than announced";
            if (cut) std::memset(want.data(), 0xab, 50);
            CHECK(std::memcmp(t.pb(0), want.data(), want.size()) == 0);
            // The target of a request cut short is in error (it counted the
            // request as executed); a malformed one never reached it.
            CHECK(t.B.p.qp_state(t.qb.handle) == (cut ? IBV_QPS_ERR : IBV_QPS_RTS));
            t.B.p.poll(t.cq_b);
            // Both engines work on: a new connection carries a send.
            t.connect();
            REQUIRE(t.up());
            if (cut) t.new_pair();
            t.send_ok();
        }
    }
}

TEST_CASE("fabric: a request from a LID the peer does not own is dropped, other segments refused", "[shim][fabric]") {
    RcOverFabric t;
    std::memset(t.pb(0), 0x11, 4096);
    Request r;
    r.opcode = IBV_WR_RDMA_WRITE;
    r.qp_type = IBV_QPT_RC;
    r.dlid = 2;
    r.sqpn = t.qa.qpn;
    r.src_incarnation = t.qa_incarnation();
    r.dqpn = t.qb.qpn;
    r.rkey = t.mb.rkey;  // a valid key: only the source LID is wrong
    r.remote_addr = t.mb.addr;
    r.length = 16;
    const std::vector<uint8_t> payload(16, 0xab);
    SECTION("the segment header names a LID of another shim: dropped, counted, the link stays") {
        r.slid = 5;
        inject(t, request_segment(r, payload, 5));
        t.pump();
        CHECK(t.lb->state() == LinkState::Up);
        CHECK(t.lb->stats.foreign_lid == 1);
        t.lb->close("test over");
    }
    SECTION("a request whose flags name an extension its fixed part does not have") {
        std::vector<uint8_t> seg = request_segment(r, payload, 1);
        CHECK(seg[sizeof(fabric::SegHeader) + offsetof(fabric::WireRequest, flags)] == 0);
        seg[sizeof(fabric::SegHeader) + offsetof(fabric::WireRequest, flags)] = fabric::kReqOperands;
        inject(t, seg);
        t.pump();
        CHECK(t.lb->close_reason() == "protocol violation: malformed request");
    }
    SECTION("a UD QP notice for a LID the peer does not own") {
        inject(t, ud_qp_notice(2, t.qa.qpn, 0));  // LID 2 is B's own
        t.pump();
        CHECK(t.lb->close_reason() == "protocol violation: a segment from a LID the peer does not own");
        CHECK(t.lb->ud_owners.empty());
    }
    SECTION("a response from a LID the peer does not own") {
        fabric::SegHeader h{};
        h.type = uint8_t(fabric::SegType::Response);
        h.flags = fabric::kSegFirst | fabric::kSegLast;
        h.fixed_len = sizeof(fabric::WireResponse);
        h.src_lid = 7;
        h.dst_lid = 2;
        h.src_qpn = t.qa.qpn;
        h.dst_qpn = t.qb.qpn;
        Response resp;
        resp.syndrome = Syndrome::Ack;
        fabric::WireResponse w = fabric::encode(resp, 0);
        std::vector<uint8_t> v(sizeof(h) + sizeof(w));
        std::memcpy(v.data(), &h, sizeof(h));
        std::memcpy(v.data() + sizeof(h), &w, sizeof(w));
        inject(t, v);
        t.pump();
        CHECK(t.lb->close_reason() == "protocol violation: a segment from a LID the peer does not own");
    }
    CHECK(t.lb->state() == LinkState::Closed);
    std::vector<uint8_t> want(4096, 0x11);
    CHECK(std::memcmp(t.pb(0), want.data(), want.size()) == 0);
    CHECK(t.B.p.poll(t.cq_b).empty());
    CHECK(t.B.p.qp_state(t.qb.handle) == IBV_QPS_RTS);
}

// What a device shim tells its peers of its UD QPs (hca_ud.h): kept by
// QPN, with the guest's LID and port GUID; the link goes on.
TEST_CASE("fabric: a UD QP notice names the guest behind a device QPN", "[shim][fabric]") {
    RcOverFabric t;
    inject(t, ud_qp_notice(1, 0x123456, 0x0011223344556677ull));
    t.pump();
    REQUIRE(t.lb->state() == LinkState::Up);
    REQUIRE(t.lb->ud_owners.count(0x123456));
    CHECK(t.lb->ud_owners.at(0x123456).lid == 1);
    CHECK(t.lb->ud_owners.at(0x123456).guid == 0x0011223344556677ull);
    // Sent by a link, it arrives the same way.
    t.lb->send_ud_qp(2, 0x42, 7);
    t.pump();
    REQUIRE(t.la->ud_owners.count(0x42));
    CHECK(t.la->ud_owners.at(0x42).lid == 2);
    CHECK(t.la->ud_owners.at(0x42).guid == 7);
    t.send_ok();
}

TEST_CASE("fabric: a request from a QP the target is not connected to is dropped", "[shim][fabric]") {
    RcOverFabric t;
    std::memset(t.pb(0), 0x11, 4096);
    Request r;
    r.opcode = IBV_WR_RDMA_WRITE;
    r.qp_type = IBV_QPT_RC;
    r.slid = 1;
    r.dlid = 2;
    r.sqpn = t.qa.qpn + 1;  // not the QP qb is connected to
    r.dqpn = t.qb.qpn;
    r.rkey = t.mb.rkey;
    r.remote_addr = t.mb.addr;
    r.length = 16;
    inject(t, request_segment(r, std::vector<uint8_t>(16, 0xab), 1));
    t.pump();
    CHECK(t.up());  // a well-formed request: dropped, not a violation
    std::vector<uint8_t> want(4096, 0x11);
    CHECK(std::memcmp(t.pb(0), want.data(), want.size()) == 0);
    // The drop is answered (one Response, no data): over a live connection
    // the requester then knows it was refused, not merely slow.
    CHECK(t.lb->stats.tx_msgs == 1);
    t.send_ok();
}

TEST_CASE("fabric: a WRITE cut short by a lost connection is never acknowledged as done", "[shim][fabric]") {
    RcOverFabric t(kMiB, 7, /*retry_cnt=*/2);
    fill(t.pa(0), kMiB, 3);
    std::memset(t.pb(0), 0xee, kMiB);
    auto w = send_wqe(1, IBV_WR_RDMA_WRITE);
    w.remote_addr = t.mb.addr;
    w.rkey = t.mb.rkey;
    t.A.p.post_send(t.qa.sq, w, {t.sa(0, kMiB)});
    // Part of the write crosses, then the connection breaks.
    t.A.eng.poll_once();
    t.la->flush();
    t.lb->on_readable();
    REQUIRE(t.lb->stats.rx_bytes > sizeof(fabric::Hello) + 1000);
    REQUIRE(t.lb->stats.rx_bytes < kMiB);
    t.A.to_peer.link = nullptr;
    t.la.reset();
    t.pump();
    REQUIRE(t.lb->state() == LinkState::Closed);
    // A new connection; A's requester resends the write (same PSN) after
    // its timeout. B must not answer it as an already executed duplicate:
    // its memory holds only part of the data.
    t.connect();
    REQUIRE(t.up());
    std::vector<abi::Cqe> sc;
    for (int i = 0; i < 8 && sc.empty(); ++i) {
        g_fake_now += ack_timeout_ns(14) + 1;
        t.pump();
        sc = t.A.p.poll(t.cq_a);
    }
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].wr_id == 1);
    if (sc[0].status == IBV_WC_SUCCESS) {
        CHECK(std::memcmp(t.pa(0), t.pb(0), kMiB) == 0);  // a success means all the data arrived
    } else {
        // The responder QP went to error when the payload was cut: the
        // requester gets an error, never a false success.
        CHECK(sc[0].status == IBV_WC_RETRY_EXC_ERR);
        CHECK(t.B.p.qp_state(t.qb.handle) == IBV_QPS_ERR);
    }
}

// Guest b's QP, destroyed; a second process of guest b (on shim B) whose QP
// then got the same QPN (what cycling QPNs would achieve) tries to use the
// connection guest a's QP still holds. Across shims the requests carry
// incarnations, so it reaches nothing, and a's requests do not reach it.
TEST_CASE("fabric: a QP that gets a destroyed peer's QPN cannot reach the old partner", "[shim][fabric][isolation]") {
    RcOverFabric t(64 * 1024, 7, /*retry_cnt=*/1);
    t.send_ok();  // the connection has carried a message: both ends are bound
    FakeProvider b2(t.B.eng, t.B.g);
    const uint32_t pd2 = b2.pd();
    auto cq2 = b2.cq(64);
    auto q2 = b2.qp(pd2, cq2, cq2);
    auto m2 = b2.mr(pd2, 4096, kAllAccess);
    std::memset(b2.at(m2.addr), 0xee, 4096);
    std::memset(t.pa(0), 0x5a, 4096);
    const uint32_t x = t.qb.qpn;
    REQUIRE(t.B.p.cmd(CmdOp::DestroyQp, abi::CmdHandleReq{t.qb.handle}).status == 0);
    Qp* q = b2.ctx().qps.get(q2.handle);
    REQUIRE(q);
    t.B.eng.qpns().remove(q->qpn);
    q->qpn = x;
    t.B.eng.qpns().add(x, b2.ctx(), q2.handle);
    b2.connect_rc(q2, 1, t.qa.qpn, kAllAccess, 0, 0);

    t.A.p.post_recv(t.qa.rq, 77, {t.sa(0, 4096)});
    const uint64_t strangers0 = t.A.eng.guests().security_of(t.A.g).stranger_requests;
    for (uint32_t op : {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ}) {
        auto w = send_wqe(op, op);
        w.remote_addr = t.ma.addr;
        w.rkey = t.ma.rkey;
        b2.post_send(q2.sq, w, {abi::Sge{m2.addr, 64, m2.lkey}});
        for (int i = 0; i < 4; ++i) {
            g_fake_now += ack_timeout_ns(14) + 1;
            t.pump();
        }
    }
    auto sc = b2.poll(cq2);
    REQUIRE(!sc.empty());
    CHECK(sc[0].status == IBV_WC_RETRY_EXC_ERR);  // as if nobody were there
    for (auto& c : sc) CHECK(c.status != IBV_WC_SUCCESS);
    CHECK(t.A.eng.guests().security_of(t.A.g).stranger_requests > strangers0);
    // Nor does a's traffic reach the newcomer (connected again, ready).
    abi::QpAttr reset{};
    reset.qp_state = IBV_QPS_RESET;
    REQUIRE(b2.modify_qp(q2.handle, IBV_QP_STATE, reset) == 0);
    b2.connect_rc(q2, 1, t.qa.qpn, kAllAccess, 0, 0);
    b2.post_recv(q2.rq, 50, {abi::Sge{m2.addr + 1024, 1024, m2.lkey}});
    t.A.p.post_send(t.qa.sq, send_wqe(60, IBV_WR_SEND), {t.sa(0, 64)});
    std::vector<abi::Cqe> ac;
    for (int i = 0; i < 16 && ac.empty(); ++i) {
        g_fake_now += ack_timeout_ns(14) + 1;
        t.pump();
        ac = t.A.p.poll(t.cq_a);
    }
    // The send fails; the QP's error flushes the receive nobody consumed.
    REQUIRE(ac.size() == 2);
    for (const auto& c : ac) CHECK(c.status == (c.wr_id == 60 ? IBV_WC_RETRY_EXC_ERR : IBV_WC_WR_FLUSH_ERR));
    CHECK(ac[0].wr_id + ac[1].wr_id == 60 + 77);
    CHECK(b2.poll(cq2).empty());
    std::vector<uint8_t> want(4096, 0x5a), mine(4096, 0xee);
    CHECK(std::memcmp(t.pa(0), want.data(), 4096) == 0);     // nothing written, the receive unconsumed
    CHECK(std::memcmp(b2.at(m2.addr), mine.data(), 4096) == 0);  // READ brought nothing, nothing received
}

// Partitions across shims: the request carries the sender's P_Key.
TEST_CASE("fabric: a UD send completes once its payload left the sender's memory, not when queued",
          "[shim][fabric]") {
    // The sender may reuse its buffer as soon as the send completes (Open
    // MPI's UD connection manager does): a datagram completed while still
    // queued went out with the next message's bytes, to the wrong process.
    UdOverFabric f;
    const uint32_t ah = f.ah();
    auto &ca = f.ca, &cb = f.cb;
    auto &qa = f.qa, &qb = f.qb;
    auto &ma = f.ma, &mb = f.mb;
    f.B.p.post_recv(qb.rq, 1, {abi::Sge{mb.addr, 100, mb.lkey}});
    f.B.p.post_recv(qb.rq, 2, {abi::Sge{mb.addr + 100, 100, mb.lkey}});
    auto w = send_wqe(10, IBV_WR_SEND);
    w.ah_handle = ah;
    w.remote_qpn = qb.qpn;
    w.remote_qkey = 0x1234;

    std::memcpy(f.A.p.at(ma.addr), "first!", 6);
    f.A.p.post_send(qa.sq, w, {abi::Sge{ma.addr, 6, ma.lkey}});
    for (int i = 0; i < 4; ++i) f.A.eng.poll_once();  // queued on the link, not written yet
    CHECK(f.A.p.poll(ca).empty());
    f.pump();
    auto sc = f.A.p.poll(ca);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    // Reused at once, as the completion allows.
    std::memcpy(f.A.p.at(ma.addr), "second", 6);
    w.wr_id = 11;
    f.A.p.post_send(qa.sq, w, {abi::Sge{ma.addr, 6, ma.lkey}});
    f.pump();
    REQUIRE(f.A.p.poll(ca).size() == 1);
    auto rc = f.B.p.poll(cb);
    REQUIRE(rc.size() == 2);
    CHECK(std::memcmp(f.B.p.at(mb.addr + abi::kUdGrhBytes), "first!", 6) == 0);
    CHECK(std::memcmp(f.B.p.at(mb.addr + 100 + abi::kUdGrhBytes), "second", 6) == 0);

    SECTION("a datagram still queued when the link closes is lost, and its send completes") {
        w.wr_id = 12;
        f.A.p.post_send(qa.sq, w, {abi::Sge{ma.addr, 6, ma.lkey}});
        for (int i = 0; i < 4; ++i) f.A.eng.poll_once();
        CHECK(f.A.p.poll(ca).empty());
        f.la->close("test");
        auto lost = f.A.p.poll(ca);
        REQUIRE(lost.size() == 1);
        CHECK(lost[0].wr_id == 12);
        CHECK(lost[0].status == IBV_WC_SUCCESS);
    }
}

TEST_CASE("fabric: a request whose P_Key its source guest is not a member of is dropped and counted",
          "[shim][fabric][isolation]") {
    // A announces guest a (LID 1) in partition 0x8001 only; a request from
    // LID 1 that claims partition 2 (B's guest is in it) is dropped at B.
    Fabric2 f;
    f.A.eng.guests().set_pkeys(f.A.g, {0x8001});
    f.B.eng.guests().set_pkeys(f.B.g, {0x8001, 0x8002});
    f.connect();
    REQUIRE(f.up());
    CHECK(f.lb->peer_member(1, 0x8001));
    CHECK(f.lb->peer_member(1, 0x0001));
    CHECK_FALSE(f.lb->peer_member(1, 0x8002));
    CHECK_FALSE(f.lb->peer_member(1, 0xffff));
    CHECK(f.la->peer_member(2, 0x8002));
    const uint32_t pb = f.B.p.pd();
    auto cb = f.B.p.cq(64);
    auto mb = f.B.p.mr(pb, 8192, kAllAccess);
    std::memset(f.B.p.at(mb.addr), 0xee, 8192);
    FakeProvider::QpSpec ud;
    ud.type = IBV_QPT_UD;
    auto qb = f.B.p.qp(pb, cb, cb, ud);
    f.B.p.ud_ready(qb, 0x1234);
    f.B.p.post_recv(qb.rq, 1, {abi::Sge{mb.addr, 4096, mb.lkey}});
    Request r;
    r.opcode = IBV_WR_SEND;
    r.qp_type = IBV_QPT_UD;
    r.slid = 1;
    r.dlid = 2;
    r.sqpn = 0x77;
    r.dqpn = qb.qpn;
    r.qkey = 0x1234;
    r.pkey = 0x8002;
    r.length = 16;
    const std::vector<uint8_t> payload(16, 0xab);
    inject(f, request_segment(r, payload, 1));
    f.pump();
    CHECK(f.lb->state() == LinkState::Up);
    CHECK(f.lb->stats.foreign_pkey == 1);
    CHECK(f.B.p.poll(cb).empty());
    CHECK(f.B.p.at(mb.addr)[0] == 0xee);
}

TEST_CASE("fabric: RC and UD between guests of different partitions fail across shims", "[shim][fabric][isolation]") {
    Fabric2 f;
    f.A.eng.guests().set_pkeys(f.A.g, {0x8001});
    const bool same = GENERATE(false, true);
    f.B.eng.guests().set_pkeys(f.B.g, {uint16_t(same ? 0x8001 : 0x8002)});
    f.connect();  // the links announce the partitions as they come up
    const uint32_t pa = f.A.p.pd(), pb = f.B.p.pd();
    auto ca = f.A.p.cq(64), cb = f.B.p.cq(64);
    auto ma = f.A.p.mr(pa, 8192, kAllAccess), mb = f.B.p.mr(pb, 8192, kAllAccess);
    std::memcpy(f.A.p.at(ma.addr), "partition", 9);
    std::memset(f.B.p.at(mb.addr), 0xee, 8192);
    const uint64_t violations0 = f.B.eng.guests().security_of(f.B.g).pkey_violations;

    // RC: a SEND.
    (void)f.B.p.qp(pb, cb, cb);  // QPNs differ between the shims
    auto qa = f.A.p.qp(pa, ca, ca), qb = f.B.p.qp(pb, cb, cb);
    f.A.p.connect_rc(qa, 2, qb.qpn, kAllAccess, 7, 1);
    f.B.p.connect_rc(qb, 1, qa.qpn, kAllAccess, 7, 1);
    f.B.p.post_recv(qb.rq, 1, {abi::Sge{mb.addr, 64, mb.lkey}});
    f.A.p.post_send(qa.sq, send_wqe(2, IBV_WR_SEND), {abi::Sge{ma.addr, 9, ma.lkey}});
    std::vector<abi::Cqe> sc;
    for (int i = 0; i < 8 && sc.empty(); ++i) {
        f.pump();
        sc = f.A.p.poll(ca);
        g_fake_now += ack_timeout_ns(14) + 1;
    }
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == (same ? IBV_WC_SUCCESS : IBV_WC_RETRY_EXC_ERR));
    auto rc = f.B.p.poll(cb);
    CHECK(rc.size() == (same ? 1u : 0u));
    CHECK((std::memcmp(f.B.p.at(mb.addr), "partition", 9) == 0) == same);

    // UD: a datagram.
    FakeProvider::QpSpec ud;
    ud.type = IBV_QPT_UD;
    auto ua = f.A.p.qp(pa, ca, ca, ud), ub = f.B.p.qp(pb, cb, cb, ud);
    f.A.p.ud_ready(ua, 0x1234);
    f.B.p.ud_ready(ub, 0x1234);
    abi::CmdCreateAhReq ahr{};
    ahr.pd_handle = pa;
    ahr.attr.dlid = 2;
    ahr.attr.port_num = 1;
    const uint32_t ah = f.A.p.cmd(CmdOp::CreateAh, ahr).as<abi::CmdCreateAhResp>().ah_handle;
    f.B.p.post_recv(ub.rq, 3, {abi::Sge{mb.addr + 4096, 100, mb.lkey}});
    auto w = send_wqe(4, IBV_WR_SEND);
    w.ah_handle = ah;
    w.remote_qpn = ub.qpn;
    w.remote_qkey = 0x1234;
    f.A.p.post_send(ua.sq, w, {abi::Sge{ma.addr, 9, ma.lkey}});
    f.pump();
    auto us = f.A.p.poll(ca);
    REQUIRE(us.size() == 1);
    CHECK(us[0].status == IBV_WC_SUCCESS);  // a datagram's send completes either way
    CHECK(f.B.p.poll(cb).size() == (same ? 1u : 0u));
    // Apart: the RC send's first try and its one retry, and the datagram.
    CHECK(f.B.eng.guests().security_of(f.B.g).pkey_violations - violations0 == (same ? 0u : 3u));
}
