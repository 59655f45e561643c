// --fabric-crypto integrity: after the TLS handshake (tls_channel.h), both
// ends derive a key and an IV per direction from the session (the TLS
// exporter) and frame the stream themselves, without encryption:
//
//   u32 length (1..kMaxFrameData) | length bytes, cleartext | 16-byte tag
//
// The tag is AES-128-GCM's over the empty plaintext with the length and the
// bytes as authenticated data, and the nonce is the IV XOR the frame's
// sequence number in its direction: a changed, dropped, reordered or
// replayed frame fails. A frame's bytes are handed on only once its tag
// verified (so nothing unverified reaches a guest); a bad tag ends the
// channel (tampered()).
//
// The same non-blocking contract as TlsChannel: write() is called again
// with the same bytes until it takes them. A taken frame is sealed in the
// output buffer (its tag over that copy, so a guest that changes its
// memory mid-send cannot make the frame fail), and frames leave in
// batches of up to four with one send: when the next would not fit, or at
// flush_output().
#pragma once

#include <openssl/evp.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vrdma::shim::fabric {

constexpr size_t kIntegrityKeyBytes = 16, kIntegrityIvBytes = 12, kIntegrityTagBytes = 16;
constexpr size_t kMaxFrameData = 64 * 1024;

struct IntegrityKeys {
    uint8_t key[kIntegrityKeyBytes];
    uint8_t iv[kIntegrityIvBytes];
};

class IntegrityChannel {
public:
    // The fd stays owned by the caller.
    IntegrityChannel(int fd, const IntegrityKeys& send, const IntegrityKeys& recv);
    IntegrityChannel(const IntegrityChannel&) = delete;
    IntegrityChannel& operator=(const IntegrityChannel&) = delete;
    ~IntegrityChannel();

    // >0: bytes taken (a whole frame sealed); 0: not now; -1: failed.
    ssize_t write(const void* p, size_t n);
    // Sends the sealed frames: 1 all out, 0 the socket is full, -1 failed.
    int flush_output();
    bool output_pending() const { return out_pos_ < out_end_; }
    // >0: verified bytes; 0: not now; -1: closed, failed or tampered.
    ssize_t read(void* p, size_t n);
    bool want_write() const { return want_write_; }
    bool buffered() const;
    bool closed() const { return closed_; }
    bool tampered() const { return tampered_; }
    const std::string& error() const { return error_; }

private:
    void nonce(const IntegrityKeys& k, uint64_t seq, uint8_t out[kIntegrityIvBytes]) const;
    bool tag(EVP_CIPHER_CTX* c, bool seal, const IntegrityKeys& k, uint64_t seq, const uint8_t* hdr,
             const uint8_t* data, size_t n, uint8_t* tag_io);
    // A whole frame at the front of the input: verified (its data becomes
    // readable) or the channel fails.
    bool open_frame();
    ssize_t failed(const std::string& why);

    int fd_;
    IntegrityKeys send_, recv_;
    EVP_CIPHER_CTX* seal_ = nullptr;
    EVP_CIPHER_CTX* open_ = nullptr;
    uint64_t send_seq_ = 0, recv_seq_ = 0;

    // Sealed frames [out_pos_, out_end_) not yet sent.
    std::vector<uint8_t> out_;
    size_t out_pos_ = 0, out_end_ = 0;

    // Received bytes [in_pos_, in_end_); of them, verified data [plain_pos_, plain_end_).
    std::vector<uint8_t> in_;
    size_t in_pos_ = 0, in_end_ = 0;
    size_t plain_pos_ = 0, plain_end_ = 0;

    bool want_write_ = false, closed_ = false, tampered_ = false;
    std::string error_;
};

}  // namespace vrdma::shim::fabric
