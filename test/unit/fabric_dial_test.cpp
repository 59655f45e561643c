// A shim does not dial a peer whose own connection to it is in its TLS
// handshake: two connections would come up, and the one closed as the
// duplicate may already carry messages. It waits for that handshake a
// second at most, so that a stalled one cannot keep it from dialing
// (docs/protocol.md "Connections"). A real Fabric on loopback; the peer is
// a listener of the test's, and the connection from the peer's address
// never says a word.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "engine.h"
#include "temp_dir.h"
#include "fabric.h"
#include "vrdma_common/unique_fd.h"

using namespace vrdma;
using namespace vrdma::shim;
using SteadyClock = std::chrono::steady_clock;

namespace {

sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    return a;
}

// A listening socket on 127.0.0.1 at a port the kernel chose.
UniqueFd listen_any(uint16_t& port) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof(a);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd.get(), 8) == 0);
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
    return fd;
}

double in_seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

TEST_CASE("fabric: a dial waits for the peer's connection in its handshake, a second at most", "[shim][fabric]") {
    vrdma::test::TempDir dir("vrdma-dial-test");
    const std::string key = dir.path + "/fabric.key";
    std::ofstream(key) << "a key of at least sixteen bytes, for this test only";

    // The peer: a listener the shim dials, whose accepts the test counts.
    uint16_t peer_port = 0;
    UniqueFd peer = listen_any(peer_port);
    // The shim's own port: one the kernel just handed out.
    uint16_t my_port = 0;
    { UniqueFd probe = listen_any(my_port); }

    SharedTables shared;
    Engine eng{Quotas{}, &shared};
    fabric::Fabric fab(eng);
    fabric::FabricConfig cfg;
    cfg.listen = "127.0.0.1:" + std::to_string(my_port);
    cfg.peers = {"127.0.0.1:" + std::to_string(peer_port)};
    cfg.key_file = key;
    cfg.lid_first = cfg.lid_last = 1;
    std::string error;
    REQUIRE(fab.start(cfg, error));

    // The peer's connection to the shim, from the peer's address, in its
    // handshake for as long as the test runs: it sends nothing.
    UniqueFd silent(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const sockaddr_in to_shim = loopback(my_port);
    REQUIRE(::connect(silent.get(), reinterpret_cast<const sockaddr*>(&to_shim), sizeof(to_shim)) == 0);
    const auto from = SteadyClock::now();

    // The shim's loop, until its dial reaches the peer (3 s at most).
    double dialed_after = -1;
    while (dialed_after < 0 && SteadyClock::now() - from < std::chrono::seconds(3)) {
        fab.poll();     // the fabric's epoll: accepts, connects, handshakes
        fab.poll(eng);  // the worker's pass
        int fd = ::accept4(peer.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
            dialed_after = in_seconds(SteadyClock::now() - from);
            ::close(fd);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    INFO("the shim dialed its peer " << dialed_after << " s after the peer's connection came in");
    // Not at once (its first dial is due at once, the peer not yet known):
    // it waited for the handshake the peer had under way.
    CHECK(dialed_after > 0.8);
    // Nor until that handshake timed out (2 s): a second at most.
    CHECK(dialed_after < 1.8);
}
