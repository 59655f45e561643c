// The fabric's AES-GCM (src/shim/transport/fabric/frame_cipher.h): two
// implementations of one cipher, chosen by each end for itself by the
// frame's size. What must hold: both give the bytes of the standard, each
// opens what the other sealed, and each refuses a frame with a changed
// byte, in both --fabric-crypto modes and at every size around the
// point where the choice changes.
#include <openssl/err.h>
#include <openssl/evp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <optional>
#include <cstdint>
#include <string>
#include <vector>

#include "frame_channel.h"

using namespace vrdma::shim::fabric;

namespace {

using Impl = FrameCipher::Impl;

std::vector<uint8_t> hex(const std::string& s) {
    std::vector<uint8_t> out;
    for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(uint8_t(std::stoul(s.substr(i, 2), nullptr, 16)));
    return out;
}

const uint8_t kKey[kFrameKeyBytes] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
                                      0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
const uint8_t kIv[kFrameIvBytes] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0xaa, 0x55};
constexpr size_t kHeader = 4;

// A frame of n data bytes sealed by `impl`: header | data | tag.
std::vector<uint8_t> sealed(Impl impl, CryptoMode mode, const std::vector<uint8_t>& data) {
    FrameCipher c(true);
    REQUIRE(c.ok());
    c.force(impl);
    REQUIRE(c.set_key(kKey));
    std::vector<uint8_t> f(kHeader + data.size() + kFrameTagBytes);
    const uint32_t len = uint32_t(data.size());
    std::memcpy(f.data(), &len, kHeader);
    REQUIRE(c.seal(mode, kIv, f.data(), kHeader, data.data(), data.size()));
    return f;
}

// Opens frame f in place with `impl`: false if it refused it.
bool opened(Impl impl, CryptoMode mode, std::vector<uint8_t>& f) {
    FrameCipher c(false);
    REQUIRE(c.ok());
    c.force(impl);
    REQUIRE(c.set_key(kKey));
    return c.open(mode, kIv, f.data(), kHeader, f.size() - kHeader - kFrameTagBytes);
}

}  // namespace

TEST_CASE("fabric: frame cipher: both implementations give the standard's bytes (GCM spec, test case 4)",
          "[shim][fabric]") {
    // AES-128, 60 bytes of plaintext, 20 bytes of authenticated data: the
    // header here is the AAD, as a frame's length is.
    const auto key = hex("feffe9928665731c6d6a8f9467308308"), iv = hex("cafebabefacedbaddecaf888");
    const auto aad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
    const auto plain = hex(
        "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de6"
        "57ba637b39");
    const auto want = hex(
        "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac9"
        "73d58e091"
        "5bc94fbc3221a5db94fae95ae7121a47");
    auto impl = GENERATE(Impl::OpenSsl, Impl::Nettle);
    CAPTURE(impl == Impl::Nettle ? "nettle" : "OpenSSL");
    FrameCipher seal(true), open(false);
    seal.force(impl);
    open.force(impl);
    REQUIRE(seal.set_key(key.data()));
    REQUIRE(open.set_key(key.data()));
    std::vector<uint8_t> f(aad);
    f.resize(aad.size() + plain.size() + kFrameTagBytes);
    REQUIRE(seal.seal(CryptoMode::Encrypt, iv.data(), f.data(), aad.size(), plain.data(), plain.size()));
    CHECK(std::vector<uint8_t>(f.begin() + long(aad.size()), f.end()) == want);
    REQUIRE(open.open(CryptoMode::Encrypt, iv.data(), f.data(), aad.size(), plain.size()));
    CHECK(std::vector<uint8_t>(f.begin() + long(aad.size()), f.end() - long(kFrameTagBytes)) == plain);
}

TEST_CASE("fabric: frame cipher: both implementations seal every size alike, open each other's frames and refuse "
          "a changed byte",
          "[shim][fabric]") {
    auto mode = GENERATE(CryptoMode::Encrypt, CryptoMode::Integrity);
    CAPTURE(crypto_mode_name(mode));
    for (size_t n : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(92), kSmallFrameBytes - 1,
                     kSmallFrameBytes, kSmallFrameBytes + 1, size_t(4096), size_t(65536)}) {
        CAPTURE(n);
        std::vector<uint8_t> data(n);
        for (size_t i = 0; i < n; ++i) data[i] = uint8_t(i * 131 + n);
        const auto by_openssl = sealed(Impl::OpenSsl, mode, data);
        const auto by_nettle = sealed(Impl::Nettle, mode, data);
        const auto by_auto = sealed(Impl::Auto, mode, data);
        REQUIRE(by_openssl == by_nettle);
        REQUIRE(by_auto == by_nettle);
        const bool clear = std::equal(data.begin(), data.end(), by_nettle.begin() + long(kHeader));
        CHECK(clear == (mode == CryptoMode::Integrity));
        for (Impl opener : {Impl::OpenSsl, Impl::Nettle, Impl::Auto}) {
            auto f = by_openssl;
            REQUIRE(opened(opener, mode, f));
            CHECK(std::equal(data.begin(), data.end(), f.begin() + long(kHeader)));
            // One changed bit in the header, the data or the tag.
            for (size_t at : {size_t(0), kHeader + n / 2, f.size() - 1}) {
                auto bad = by_nettle;
                bad[at] ^= 0x20;
                CAPTURE(at);
                CHECK_FALSE(opened(opener, mode, bad));
            }
        }
    }
}

TEST_CASE("fabric: frame cipher: frames up to kSmallFrameBytes go through nettle, larger ones through OpenSSL",
          "[shim][fabric]") {
    FrameCipher c(true);
    const bool fast = FrameCipher::nettle_usable();
    CHECK(c.uses_nettle(1) == fast);
    CHECK(c.uses_nettle(kSmallFrameBytes) == fast);
    CHECK_FALSE(c.uses_nettle(kSmallFrameBytes + 1));
    c.force(Impl::OpenSsl);
    CHECK_FALSE(c.uses_nettle(1));
}

TEST_CASE("fabric: frame cipher: with OpenSSL in FIPS mode every frame goes through OpenSSL", "[shim][fabric]") {
    // Only the default properties change (fips=yes); no frame is sealed,
    // so no FIPS provider needs to be installed.
    struct Restore {
        ~Restore() {
            EVP_default_properties_enable_fips(nullptr, 0);
            ERR_clear_error();  // the AES-GCM that could not be fetched under fips=yes
        }
    };
    std::optional<FrameCipher> c;
    {
        Restore restore;
        REQUIRE(EVP_default_properties_enable_fips(nullptr, 1) == 1);
        c.emplace(true);
    }
    REQUIRE(EVP_default_properties_is_fips_enabled(nullptr) == 0);
    CHECK_FALSE(c->uses_nettle(1));
    CHECK_FALSE(c->uses_nettle(kSmallFrameBytes));
    FrameCipher after(true);
    CHECK(after.uses_nettle(1) == FrameCipher::nettle_usable());
}
