// Test helpers for the shim's fabric (src/shim/transport/fabric): a fabric
// key from a temporary file and a TLS context from it, a non-blocking UNIX
// stream socketpair for a Link to run over, a Transport that hands requests
// to one Link (what fabric::Peer does, without a Fabric around it), and the
// peer's half of the TLS handshake and Hello done by hand (the fuzz harness and the unit tests play a hostile
// peer with it). Used by test/unit/fabric_test.cpp and
// test/fuzz/fuzz_fabric.cpp; needs the shim core (vrdma_shim_core).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "engine.h"
#include "fabric_key.h"
#include "link.h"
#include "tls_channel.h"
#include "transport.h"
#include "wire.h"

namespace vrdma::fabric_test {

namespace fabric = vrdma::shim::fabric;

// Loads `text` as a fabric key (through a mode-600 temporary file, as the
// shim reads it). False on any failure.
inline bool load_key(fabric::FabricKey& key, const std::string& text) {
    char path[] = "/tmp/vrdma-fabric-key.XXXXXX";
    int fd = ::mkstemp(path);
    if (fd < 0) return false;
    bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, text.data(), text.size()) == ssize_t(text.size());
    ::close(fd);
    std::string err;
    ok = ok && key.load(path, err);
    ::unlink(path);
    return ok;
}

// A connected pair of non-blocking UNIX stream sockets (a Link only reads
// and writes its fd, so a UNIX stream works where TCP would).
inline bool socket_pair(int fds[2]) {
    return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0;
}

// A Transport over one Link: what fabric::Peer::send and qp_gone do. A missing or
// closed link loses the request (Drop: the requester's timer decides).
class LinkTransport final : public shim::Transport {
public:
    fabric::Link* link = nullptr;
    // The engine whose route table points here: the routes go with this
    // object (an engine destroyed later must not call a dead transport).
    shim::Engine* routed_in = nullptr;
    LinkTransport() = default;
    LinkTransport(const LinkTransport&) = delete;
    LinkTransport& operator=(const LinkTransport&) = delete;
    ~LinkTransport() override {
        if (routed_in) routed_in->routes().remove(this);
    }

    const char* name() const override { return "test-link"; }
    bool keeps_memory() const override { return true; }
    shim::SendResult send(shim::Engine&, shim::Context& ctx, shim::Qp&, const shim::Request& req,
                          const shim::Span* local, uint32_t nlocal, shim::Pins* pins,
                          shim::Response& resp) override {
        if (!link || link->state() != fabric::LinkState::Up) {
            resp = shim::Response{};
            resp.syndrome = shim::Syndrome::Drop;
            resp.psn = req.psn;
            return shim::SendResult::Done;
        }
        if (!link->send_request(req, ctx.id(), local, nlocal, req.inline_payload, pins))
            return shim::SendResult::Busy;
        return shim::SendResult::InFlight;
    }
    void qp_gone(uint16_t lid, uint32_t qpn, uint16_t peer_lid, uint32_t peer_qpn, int) override {
        if (link && link->state() == fabric::LinkState::Up) link->send_qp_gone(lid, qpn, peer_lid, peer_qpn);
    }
};

// Writes all of [p, p+n) to a non-blocking fd, calling `pump` whenever the
// socket is full. False if the other end is gone.
template <typename Pump>
bool write_all(int fd, const void* p, size_t n, Pump&& pump) {
    auto* b = static_cast<const uint8_t*>(p);
    int stuck = 0;
    while (n > 0) {
        ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
        if (w > 0) {
            b += w;
            n -= size_t(w);
            stuck = 0;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR) return false;
        if (++stuck > 1000) return false;  // nobody reads: give up rather than hang
        pump();
    }
    return true;
}

// Reads and drops whatever is readable on a non-blocking fd. Returns the
// number of bytes.
inline size_t drain(int fd) {
    static uint8_t sink[256 * 1024];
    size_t total = 0;
    for (;;) {
        ssize_t r = ::read(fd, sink, sizeof(sink));
        if (r <= 0) return total;
        total += size_t(r);
    }
}

// A TLS context for `key_text` in `mode`. False on any failure.
inline bool make_tls(fabric::TlsContext& tls, const std::string& key_text,
                     fabric::CryptoMode mode = fabric::CryptoMode::Encrypt) {
    fabric::FabricKey key;
    std::string err;
    return load_key(key, key_text) && tls.init(key, mode, err);
}

// An instance id filled with `fill`.
inline fabric::InstanceId instance(uint8_t fill) {
    fabric::InstanceId id;
    id.fill(fill);
    return id;
}

// Writes all of [p, p+n) through a channel (TLS records or frames) and
// sends it, calling `pump` whenever the socket is full. False if the
// channel failed.
template <typename Channel, typename Pump>
bool channel_write_all(Channel& ch, const void* p, size_t n, Pump&& pump) {
    auto* b = static_cast<const uint8_t*>(p);
    int stuck = 0;
    while (n > 0) {
        ssize_t w = ch.write(b, n);
        if (w < 0) return false;
        if (w > 0) {
            b += w;
            n -= size_t(w);
            stuck = 0;
            continue;
        }
        if (++stuck > 1000) return false;
        pump();
    }
    // Frames are held until they are flushed.
    if constexpr (requires { ch.flush_output(); }) {
        for (;;) {
            const int f = ch.flush_output();
            if (f != 0) return f > 0;
            if (++stuck > 1000) return false;
            pump();
        }
    }
    return true;
}

// The peer's frames after the Hellos, over `fd` (the socket of `ch`), in
// the mode of `tls`, as the dialer if `dialer`.
inline std::unique_ptr<fabric::FrameChannel> peer_frames(const fabric::TlsChannel& ch, int fd,
                                                         fabric::CryptoMode mode, bool dialer) {
    return std::make_unique<fabric::FrameChannel>(fd, mode, ch.frame_keys(mode, dialer), ch.frame_keys(mode, !dialer));
}

// The peer's side of the connection to `link` (whose other end is `fd`),
// through `ch` (a TlsChannel over `fd`, the client when the link listens):
// the TLS handshake, `hello` through the channel, the link's Hello read
// back into `link_hello_out`. True when every step went through (the link
// may still refuse the Hello: check its state).
template <typename Pump>
bool peer_handshake(fabric::TlsChannel& ch, const fabric::Hello& hello, Pump&& pump,
                    fabric::Hello* link_hello_out = nullptr) {
    int rounds = 0;
    for (;;) {
        fabric::TlsChannel::Step s = ch.handshake();
        if (s == fabric::TlsChannel::Step::Done) break;
        if (s == fabric::TlsChannel::Step::Failed || ++rounds > 1000) return false;
        pump();
    }
    if (!channel_write_all(ch, &hello, sizeof(hello), pump)) return false;
    fabric::Hello theirs;
    size_t got = 0;
    for (int idle = 0; got < sizeof(theirs);) {
        ssize_t r = ch.read(reinterpret_cast<uint8_t*>(&theirs) + got, sizeof(theirs) - got);
        if (r < 0) return false;
        if (r == 0) {
            if (++idle > 1000) return false;
            pump();
            continue;
        }
        got += size_t(r);
    }
    if (link_hello_out) *link_hello_out = theirs;
    return true;
}

// A Hello from a peer shim owning LIDs [first, last].
inline fabric::Hello make_hello(uint16_t first, uint16_t last, uint8_t instance_fill = 0x5a,
                                fabric::CryptoMode mode = fabric::CryptoMode::Encrypt) {
    fabric::Hello h{};
    h.magic = fabric::kHelloMagic;
    h.version = fabric::kProtocolVersion;
    std::memset(h.instance, instance_fill, sizeof(h.instance));
    h.lid_first = first;
    h.lid_last = last;
    h.crypto_mode = uint8_t(mode);
    h.workers = 1;  // worker 0 of one, asking for the link's worker 0
    return h;
}

}  // namespace vrdma::fabric_test
