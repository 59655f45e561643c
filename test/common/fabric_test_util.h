// Test helpers for the shim's fabric (src/shim/transport/fabric): a fabric
// key from a temporary file, a non-blocking UNIX stream socketpair for a
// Link to run over, a Transport that hands requests to one Link (what
// fabric::Peer does, without a Fabric around it), and the peer's half of the
// handshake done by hand (the fuzz harness and the unit tests play a hostile
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
#include <string>

#include "engine.h"
#include "fabric_key.h"
#include "link.h"
#include "transport.h"
#include "wire.h"

namespace vrdma::fabric_test {

namespace fabric = vrdma::shim::fabric;

// What link.cpp puts in front of both Hellos in the handshake's HMAC. A
// test that fails here after a protocol change: update it with link.cpp.
inline constexpr const char* kAuthLabel = "vrdma fabric v1 auth";

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

// A Transport over one Link: what fabric::Peer::send does. A missing or
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

// Reads exactly n bytes from a non-blocking fd, calling `pump` while none
// are there. False on end of file or after too many empty rounds.
template <typename Pump>
bool read_exact(int fd, void* out, size_t n, Pump&& pump) {
    auto* b = static_cast<uint8_t*>(out);
    int idle = 0;
    while (n > 0) {
        ssize_t r = ::read(fd, b, n);
        if (r > 0) {
            b += r;
            n -= size_t(r);
            idle = 0;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EINTR)) return false;
        if (++idle > 100) return false;
        pump();
    }
    return true;
}

// The peer's side of the handshake against `link` (whose other end is
// `fd`): sends `hello`, reads the link's Hello, answers with the HMAC that
// `key` gives (the right one when it is the link's key) and reads the
// link's Auth. `link_hello_out` gets the link's Hello. True when every
// step went through (the link may still refuse a wrong key: check its
// state).
inline bool peer_handshake(int fd, fabric::Link& link, const fabric::FabricKey& key, const fabric::Hello& hello,
                           fabric::Hello* link_hello_out = nullptr) {
    auto pump = [&] {
        link.flush();
        link.on_readable();
        link.flush();
    };
    if (!write_all(fd, &hello, sizeof(hello), pump)) return false;
    fabric::Hello theirs;
    if (!read_exact(fd, &theirs, sizeof(theirs), pump)) return false;
    fabric::Auth a;
    key.mac(kAuthLabel, &hello, sizeof(hello), &theirs, sizeof(theirs), a.mac);
    if (!write_all(fd, &a, sizeof(a), pump)) return false;
    pump();
    if (link_hello_out) *link_hello_out = theirs;
    fabric::Auth got;
    return read_exact(fd, &got, sizeof(got), pump);
}

// A Hello from a peer shim owning LIDs [first, last].
inline fabric::Hello make_hello(uint16_t first, uint16_t last, uint8_t nonce_fill = 0x5a) {
    fabric::Hello h{};
    h.magic = fabric::kHelloMagic;
    h.version = fabric::kProtocolVersion;
    std::memset(h.nonce, nonce_fill, sizeof(h.nonce));
    h.instance = 0x1234567890abcdefull;
    h.lid_first = first;
    h.lid_last = last;
    return h;
}

}  // namespace vrdma::fabric_test
