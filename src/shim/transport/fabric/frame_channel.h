// The data channel between two shims once the TLS handshake and the Hellos
// are through (tls_channel.h). Both ends take a key and an IV per
// direction from the TLS session (its RFC 8446 exporter, as DTLS-SRTP keys
// SRTP) and frame the stream themselves:
//
//   u32 length (1..kMaxFrameData) | length bytes | 16-byte tag
//
// --fabric-crypto encrypt: the bytes are AES-128-GCM ciphertext, the
// length its authenticated data (TLS 1.3's record protection, in frames of
// 64 KiB instead of records of 16 KiB). integrity: the bytes travel as they
// are, and the tag is GCM's over the empty plaintext with the length and
// the bytes as authenticated data (GMAC). frame_cipher.h does the AES-GCM
// (two implementations of it, by the frame's size).
//
// The nonce is the IV XOR the frame's sequence number in its direction, so
// a changed, dropped, reordered or replayed frame fails. Every
// kFramesPerKey frames both ends move to the next generation of keys (the
// exporter again, with the generation as context), well inside AES-GCM's
// limits per key. A frame's bytes are handed on only once its tag verified
// (nothing unverified reaches a guest); a bad tag ends the channel
// (tampered()).
//
// Non-blocking, like TlsChannel: write() is called again with the same
// bytes until it takes them. A taken frame is sealed into the output
// buffer at once (its tag over that copy, so a guest that changes its
// memory mid-send cannot make the frame fail), and frames leave in batches
// of up to four with one send: when the next would not fit, or at
// flush_output().
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "frame_cipher.h"

namespace vrdma::shim::fabric {

const char* crypto_mode_name(CryptoMode m);
bool parse_crypto_mode(const std::string& text, CryptoMode& out);

constexpr size_t kFrameHeaderBytes = 4;
constexpr size_t kMaxFrameData = 64 * 1024;
// 2^20 frames of at most 64 KiB: at most 64 GiB under one key, below the
// 2^24.5 full 16 KiB records (about 380 GB) RFC 8446 section 5.5 allows.
constexpr uint64_t kFramesPerKey = uint64_t(1) << 20;

struct FrameKeys {
    uint8_t key[kFrameKeyBytes];
    uint8_t iv[kFrameIvBytes];
};

// The keys of one direction for a generation (0 first). False: none.
using FrameKeySource = std::function<bool(uint64_t generation, FrameKeys& out)>;

class FrameChannel {
public:
    // The fd stays owned by the caller. error() is set if a source gave no
    // keys for generation 0.
    FrameChannel(int fd, CryptoMode mode, FrameKeySource send, FrameKeySource recv);
    FrameChannel(const FrameChannel&) = delete;
    FrameChannel& operator=(const FrameChannel&) = delete;
    ~FrameChannel();

    // >0: bytes taken (a whole frame sealed); 0: not now; -1: failed.
    ssize_t write(const void* p, size_t n);
    // Sends the sealed frames: 1 all out, 0 the socket is full, -1 failed.
    int flush_output();
    bool output_pending() const { return out_pos_ < out_end_; }
    // >0: verified bytes; 0: not now; -1: closed, failed or tampered.
    ssize_t read(void* p, size_t n);
    bool buffered() const;
    bool closed() const { return closed_; }
    bool tampered() const { return tampered_; }
    const std::string& error() const { return error_; }
    // Tests: a smaller key lifetime (both ends must use the same), and how
    // many times each direction moved to new keys.
    void set_frames_per_key(uint64_t n) { frames_per_key_ = n; }
    uint64_t send_generation() const { return send_.generation; }
    uint64_t recv_generation() const { return recv_.generation; }

private:
    // One direction: its key schedule and where it stands in it.
    struct Direction {
        explicit Direction(bool sealing) : cipher(sealing) {}
        FrameKeySource source;
        FrameKeys keys{};
        FrameCipher cipher;
        uint64_t seq = 0, generation = 0;
    };
    // Loads generation `g` of d's keys into its cipher.
    bool load_keys(Direction& d, uint64_t g);
    // After a frame: the next one may be under new keys.
    bool advance(Direction& d);
    void nonce(const Direction& d, uint8_t out[kFrameIvBytes]) const;
    // A whole frame at the front of the input: verified (its data becomes
    // readable) or the channel fails.
    [[gnu::noinline]] bool open_frame();  // noinline: scripts/bench-instructions.sh counts it by name
    ssize_t failed(const std::string& why);

    int fd_;
    CryptoMode mode_;
    uint64_t frames_per_key_ = kFramesPerKey;
    Direction send_{true}, recv_{false};

    // Sealed frames [out_pos_, out_end_) not yet sent.
    std::vector<uint8_t> out_;
    size_t out_pos_ = 0, out_end_ = 0;

    // Received bytes [in_pos_, in_end_); of them, verified data [plain_pos_, plain_end_).
    std::vector<uint8_t> in_;
    size_t in_pos_ = 0, in_end_ = 0;
    size_t plain_pos_ = 0, plain_end_ = 0;

    bool closed_ = false, tampered_ = false;
    std::string error_;
};

}  // namespace vrdma::shim::fabric
