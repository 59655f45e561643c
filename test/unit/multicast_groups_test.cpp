// The shim's multicast groups (multicast_groups.h): membership, limits,
// the views workers read, and the MLID every shim derives from an MGID.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <vector>

#include "multicast_groups.h"

using namespace vrdma::shim;

namespace {
struct Gid {
    uint8_t raw[16] = {0xff, 0x12, 0x40, 0x1b, 0xff, 0xff};
    explicit Gid(uint32_t tail) {
        for (int i = 0; i < 4; ++i) raw[12 + i] = uint8_t(tail >> (24 - 8 * i));
    }
};

std::vector<uint32_t> members(const MulticastGroups& g, const Gid& gid) {
    std::vector<uint32_t> out;
    g.view()->for_each_member(mlid_of(gid.raw), gid.raw, [&](const McastMember& m) { out.push_back(m.qpn); });
    return out;
}
}  // namespace

TEST_CASE("multicast groups: attach once, detach what is attached, a destroyed QP leaves every group") {
    MulticastGroups g;
    const Gid a(1), b(2);
    const uint64_t gen0 = g.generation();
    REQUIRE(g.attach(1, 100, a.raw) == 0);
    REQUIRE(g.attach(1, 100, a.raw) == 0);  // again: nothing changes
    REQUIRE(g.attach(2, 200, a.raw) == 0);
    REQUIRE(g.attach(2, 200, b.raw) == 0);
    CHECK(g.generation() != gen0);
    CHECK(members(g, a) == std::vector<uint32_t>{100, 200});
    CHECK(members(g, b) == std::vector<uint32_t>{200});
    // A unicast GID is no group.
    uint8_t unicast[16] = {0xfe, 0x80};
    CHECK(g.attach(1, 100, unicast) == EINVAL);
    // Detach: only a member of that group, as that guest.
    CHECK(g.detach(1, 100, b.raw) == EINVAL);
    CHECK(g.detach(3, 200, a.raw) == EINVAL);
    REQUIRE(g.detach(1, 100, a.raw) == 0);
    CHECK(g.detach(1, 100, a.raw) == EINVAL);
    CHECK(members(g, a) == std::vector<uint32_t>{200});
    // A view taken before a change stays as it was.
    auto before = g.view();
    g.detach_all(200);
    CHECK(members(g, a).empty());
    CHECK(members(g, b).empty());
    size_t seen = 0;
    before->for_each_member(mlid_of(a.raw), a.raw, [&](const McastMember&) { ++seen; });
    CHECK(seen == 1);
}

TEST_CASE("multicast groups: without a GRH a datagram reaches every group of its MLID; limits hold") {
    MulticastGroups g;
    const Gid a(7);
    REQUIRE(g.attach(1, 10, a.raw) == 0);
    size_t n = 0;
    g.view()->for_each_member(mlid_of(a.raw), nullptr, [&](const McastMember&) { ++n; });
    CHECK(n == 1);
    n = 0;
    g.view()->for_each_member(uint16_t(mlid_of(a.raw) ^ 1), nullptr, [&](const McastMember&) { ++n; });
    CHECK(n == 0);

    // QPs in one group: 64 of one guest, 256 in all.
    for (uint32_t q = 1; q < MulticastGroups::kMaxQpsPerGroupPerGuest; ++q) REQUIRE(g.attach(1, 10 + q, a.raw) == 0);
    CHECK(g.attach(1, 5000, a.raw) == ENOMEM);
    for (uint16_t lid = 2; lid < 5; ++lid)
        for (uint32_t q = 0; q < MulticastGroups::kMaxQpsPerGroupPerGuest; ++q)
            REQUIRE(g.attach(lid, lid * 1000 + q, a.raw) == 0);
    CHECK(g.attach(5, 9000, a.raw) == ENOMEM);  // the group is full
    // Groups one guest opens: 256; another guest still opens its own, and
    // joins those of the first.
    MulticastGroups h;
    for (uint32_t i = 0; i < MulticastGroups::kMaxGroupsPerGuest; ++i) {
        const Gid gi(i);
        REQUIRE(h.attach(3, 1, gi.raw) == 0);
    }
    const Gid over(MulticastGroups::kMaxGroupsPerGuest);
    CHECK(h.attach(3, 1, over.raw) == ENOMEM);
    CHECK(h.attach(4, 2, over.raw) == 0);
    const Gid first(0);
    CHECK(h.attach(4, 2, first.raw) == 0);
    // Leaving gives the guest its room back.
    REQUIRE(h.detach(3, 1, Gid(5).raw) == 0);
    CHECK(h.attach(3, 1, Gid(100000).raw) == 0);
}

TEST_CASE("an MGID's MLID is a multicast LID, the same on every shim") {
    for (uint32_t i = 0; i < 4096; ++i) {
        const Gid gi(i * 2654435761u);
        const uint16_t mlid = mlid_of(gi.raw);
        REQUIRE(is_multicast_lid(mlid));
        REQUIRE(mlid > 0xc000);
        REQUIRE(mlid_of(gi.raw) == mlid);
    }
    CHECK_FALSE(is_multicast_lid(0xffff));
    CHECK_FALSE(is_multicast_lid(0xbfff));
}
