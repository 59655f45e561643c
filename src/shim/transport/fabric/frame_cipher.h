// AES-128-GCM for one direction of the fabric's frames (frame_channel.h),
// by two implementations of the same cipher, chosen by the frame's size:
//   - up to kSmallFrameBytes of data: nettle's. Its fixed cost is about a
//     third of OpenSSL 3's, whose EVP layer looks parameters up by name at
//     every new IV and at every tag (callgrind, a 92-byte frame: about
//     1,000 instructions to seal or open against about 3,000);
//   - above: OpenSSL's, whose AES-NI code with GHASH stitched into it is
//     about twice as fast a byte.
// The bytes on the wire are the same either way (fabric_frame_cipher_test.cpp,
// "both implementations seal every size alike"), so the choice is each end's
// own. nettle is used only where the CPU has AES-NI and PCLMULQDQ (its
// fallback without them is table code, which leaks through the cache),
// and never where OpenSSL runs in FIPS mode (its default properties ask
// for fips=yes): there every frame stays in the validated module.
#pragma once

#include <openssl/evp.h>
#include <nettle/gcm.h>

#include <cstddef>
#include <cstdint>

namespace vrdma::shim::fabric {

// --fabric-crypto: what the frames protect.
enum class CryptoMode : uint8_t {
    Encrypt = 1,    // confidentiality, integrity, order
    Integrity = 2,  // integrity and order; the bytes travel in clear
};

constexpr size_t kFrameKeyBytes = 16, kFrameIvBytes = 12, kFrameTagBytes = 16;
// Where nettle's lower fixed cost stops paying for its slower bytes: about
// 600 bytes when encrypting, 1 KiB for integrity only (this machine, OpenSSL
// 3.0.19 and nettle 3.8.1; docs/performance.md).
constexpr size_t kSmallFrameBytes = 512;

class FrameCipher {
public:
    // Which implementation frames get: Auto by size (the shim), or one of
    // them for every size (the tests that compare them).
    enum class Impl : uint8_t { Auto, OpenSsl, Nettle };

    // sealing: this direction's frames are sealed here (else opened).
    // ok() is false if OpenSSL cannot set up AES-GCM.
    explicit FrameCipher(bool sealing);
    FrameCipher(const FrameCipher&) = delete;
    FrameCipher& operator=(const FrameCipher&) = delete;
    ~FrameCipher();

    bool ok() const { return evp_ != nullptr; }
    // Both implementations take the key.
    bool set_key(const uint8_t key[kFrameKeyBytes]);
    // The frame at f: a header of `header` bytes, authenticated as is,
    // then n data bytes, then the tag. seal copies the data from src into
    // the frame (encrypted, or as they are with a tag over them), reading
    // src once; open verifies the tag and decrypts in place. False: failed
    // (open: a bad tag).
    // noinline: scripts/bench-instructions.sh counts seal() by name.
    [[gnu::noinline]] bool seal(CryptoMode mode, const uint8_t iv[kFrameIvBytes], uint8_t* f, size_t header,
                                const void* src, size_t n);
    bool open(CryptoMode mode, const uint8_t iv[kFrameIvBytes], uint8_t* f, size_t header, size_t n);

    // Tests: force one implementation; and whether nettle serves n bytes.
    void force(Impl impl) { impl_ = impl; }
    bool uses_nettle(size_t n) const;
    // Whether this CPU lets nettle run constant-time (AES-NI, PCLMULQDQ).
    static bool nettle_usable();

private:
    bool seal_openssl(CryptoMode mode, const uint8_t* iv, uint8_t* f, size_t header, const void* src, size_t n);
    bool open_openssl(CryptoMode mode, const uint8_t* iv, uint8_t* f, size_t header, size_t n);
    bool seal_nettle(CryptoMode mode, const uint8_t* iv, uint8_t* f, size_t header, const void* src, size_t n);
    bool open_nettle(CryptoMode mode, const uint8_t* iv, uint8_t* f, size_t header, size_t n);

    bool sealing_;
    bool small_by_nettle_;  // nettle_usable() and not FIPS, at construction
    Impl impl_ = Impl::Auto;
    EVP_CIPHER_CTX* evp_ = nullptr;
    gcm_aes128_ctx nettle_{};
};

}  // namespace vrdma::shim::fabric
