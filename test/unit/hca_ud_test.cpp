// The parts of UD through a device that need no device (hca_ud.h,
// hca_device.h): reading the sender's address from what a RoCE device
// wrote before a datagram, and the scatter list that puts those 40 bytes
// in the shim's header slot and the payload in the guest's buffers.
#include <catch2/catch.hpp>
#include <cstring>

#include "hca_device.h"
#include "hca_ud.h"

using namespace vrdma;
using namespace vrdma::shim;

TEST_CASE("hca UD: the sender's GID from a RoCE v2 IPv4 header", "[shim][hca]") {
    uint8_t g[40] = {};
    uint8_t* ip = g + 20;  // rxe and mlx5: 20 bytes of zeros, then the IPv4 header
    ip[0] = 0x45;          // version 4, IHL 5
    ip[1] = 0x28;          // TOS: the traffic class
    ip[8] = 63;            // TTL: the hop limit
    const uint8_t src[4] = {10, 10, 0, 2};
    std::memcpy(ip + 12, src, 4);
    DeviceHeader h;
    REQUIRE(parse_device_header(g, h));
    const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 10, 0, 2};
    CHECK(std::memcmp(h.sgid, want, 16) == 0);
    CHECK(h.traffic_class == 0x28);
    CHECK(h.hop_limit == 63);
}

TEST_CASE("hca UD: the sender's GID from an IPv6 header or a GRH", "[shim][hca]") {
    uint8_t g[40] = {};
    g[0] = 0x6a;  // version 6, traffic class 0xab
    g[1] = 0xb0;
    g[7] = 5;
    for (int i = 0; i < 16; ++i) g[8 + i] = uint8_t(0xf0 + i);
    DeviceHeader h;
    REQUIRE(parse_device_header(g, h));
    CHECK(h.sgid[0] == 0xf0);
    CHECK(h.sgid[15] == 0xff);
    CHECK(h.traffic_class == 0xab);
    CHECK(h.hop_limit == 5);
}

TEST_CASE("hca UD: bytes that are no network header name no sender", "[shim][hca]") {
    uint8_t g[40] = {};
    DeviceHeader h;
    CHECK_FALSE(parse_device_header(g, h));
    g[20] = 0x46;  // IPv4 with options: not what a device writes
    CHECK_FALSE(parse_device_header(g, h));
}

TEST_CASE("hca UD: the device scatters the header into the shim's slot, the payload after 40 guest bytes",
          "[shim][hca]") {
    const ibv_sge slot{0x1000, 40, 7};
    ibv_sge out[abi::kMaxSge + 1];
    SECTION("one guest SGE") {
        const abi::Sge in[1] = {{0x50000, 4136, 9}};
        REQUIRE(ud_receive_sges(slot, in, 1, out) == 2);
        CHECK(out[0].addr == 0x1000);
        CHECK(out[0].lkey == 7);
        CHECK(out[1].addr == 0x50000 + 40);
        CHECK(out[1].length == 4096);
        CHECK(out[1].lkey == 9);
    }
    SECTION("the guest's 40 bytes span SGEs") {
        const abi::Sge in[3] = {{0x100, 16, 1}, {0x200, 24, 2}, {0x300, 100, 3}};
        REQUIRE(ud_receive_sges(slot, in, 3, out) == 2);  // the first two hold only the GRH
        CHECK(out[1].addr == 0x300);
        CHECK(out[1].length == 100);
        CHECK(out[1].lkey == 3);
    }
    SECTION("an SGE cut inside") {
        const abi::Sge in[2] = {{0x100, 30, 1}, {0x200, 50, 2}};
        REQUIRE(ud_receive_sges(slot, in, 2, out) == 2);
        CHECK(out[1].addr == 0x200 + 10);
        CHECK(out[1].length == 40);
    }
    SECTION("a buffer without room past the GRH gets the slot only") {
        const abi::Sge in[1] = {{0x100, 40, 1}};
        CHECK(ud_receive_sges(slot, in, 1, out) == 1);
    }
}
