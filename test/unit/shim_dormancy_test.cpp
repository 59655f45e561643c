// Idle contexts (docs/protocol.md): a context without work for a while
// leaves the engine's passes, its guest is told the shim sleeps, and its
// next doorbell (the kick eventfd) brings it back; the periodic sweep also
// finds its work if no kick came. The engine is run here as the daemon runs
// it: a kick read from the eventfd wakes the context, then a pass.
#include <sys/eventfd.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "shim_harness.h"

using namespace vrdma;
using namespace vrdma::shim;
using namespace vrdma::shim::test;
using abi::CmdOp;

namespace {

// One guest process attached with a kick eventfd, as through the socket.
struct KickedGuest {
    Engine eng;
    const GuestIdentity& g;
    abi_client::Client c;
    UniqueFd kick;
    Context* ctx = nullptr;
    bool daemon_reads_kicks = true;
    unsigned kicks = 0;

    KickedGuest() : g(eng.add_guest("a", 1, 0x1111)) {
        eng.set_clock(fake_clock);
        kick.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        REQUIRE(kick);
        REQUIRE(c.arena().open(FakeProvider::kArenaLen));
        int err = 0;
        ctx = eng.attach(g, UniqueFd(dup(c.arena().fd())), c.gva(), c.arena().len(), UniqueFd(dup(kick.get())),
                         UniqueFd(), UniqueFd(), err);
        REQUIRE(ctx);
        c.set_kick_fd(kick.get());
        c.set_wait([this](const std::function<bool()>& done) {
            pass();
            return done() ? 0 : abi_client::kNoAnswer;
        });
    }
    // What the daemon does: a kick wakes its context; then a pass.
    void pass() {
        uint64_t v;
        if (daemon_reads_kicks && ::read(kick.get(), &v, sizeof(v)) == ssize_t(sizeof(v))) {
            ++kicks;
            eng.wake(*ctx);
        }
        eng.poll_once();
    }
    void idle_for(uint64_t ns) {
        g_fake_now += ns;
        pass();
    }
};

}  // namespace

TEST_CASE("an idle context goes dormant, and its doorbell wakes it", "[shim][engine][dormancy]") {
    KickedGuest t;
    uint32_t pd = 0;
    REQUIRE(t.c.alloc_pd(pd) == 0);
    CHECK(t.eng.dormant_count() == 0);
    CHECK(t.c.cb()->shim_sleeping.load() == 0);

    t.idle_for(Dormancy::kDormantAfterNs + Dormancy::kSweepNs);
    CHECK(t.eng.dormant_count() == 1);
    CHECK(t.c.cb()->shim_sleeping.load() == 1);  // its guest now kicks

    // A command: the doorbell, then a kick (the shim "sleeps" for this
    // context); the kick wakes it and the command is served at once.
    uint32_t pd2 = 0;
    REQUIRE(t.c.alloc_pd(pd2) == 0);
    CHECK(pd2 != pd);
    CHECK(t.kicks == 1);
    CHECK(t.eng.dormant_count() == 0);
    CHECK(t.c.cb()->shim_sleeping.load() == 0);  // awake: no more kicks
    REQUIRE(t.c.alloc_pd(pd2) == 0);
    CHECK(t.kicks == 1);
}

TEST_CASE("a dormant context whose kick is lost is still served by the sweep", "[shim][engine][dormancy]") {
    KickedGuest t;
    t.idle_for(Dormancy::kDormantAfterNs + Dormancy::kSweepNs);
    REQUIRE(t.eng.dormant_count() == 1);
    t.daemon_reads_kicks = false;
    const uint32_t served = t.c.cb()->cmd_consumer.load();
    auto r = t.c.cmd(CmdOp::AllocPd);  // one pass: not served (dormant, no wake)
    CHECK(r.status == abi_client::kNoAnswer);
    CHECK(t.c.cb()->cmd_consumer.load() == served);
    // The next sweep looks at dormant contexts and finds the command.
    t.idle_for(Dormancy::kSweepNs);
    CHECK(t.eng.dormant_count() == 0);
    CHECK(t.c.cb()->cmd_consumer.load() != served);
}

TEST_CASE("an in-process context without a kick eventfd never goes dormant", "[shim][engine][dormancy]") {
    TwoGuests t;
    g_fake_now += 10 * (Dormancy::kDormantAfterNs + Dormancy::kSweepNs);
    t.run(2);
    CHECK(t.eng.dormant_count() == 0);
    CHECK(t.a.pd() != 0);
}
