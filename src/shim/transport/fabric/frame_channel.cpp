#include "frame_channel.h"

#include <sys/socket.h>

#include <openssl/crypto.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace vrdma::shim::fabric {
namespace {

constexpr size_t kFrameMax = kFrameHeaderBytes + kMaxFrameData + kFrameTagBytes;

uint32_t get_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

}  // namespace

const char* crypto_mode_name(CryptoMode m) { return m == CryptoMode::Integrity ? "integrity" : "encrypt"; }

bool parse_crypto_mode(const std::string& text, CryptoMode& out) {
    if (text == "encrypt") {
        out = CryptoMode::Encrypt;
        return true;
    }
    if (text == "integrity") {
        out = CryptoMode::Integrity;
        return true;
    }
    return false;
}

FrameChannel::FrameChannel(int fd, CryptoMode mode, FrameKeySource send, FrameKeySource recv)
    : fd_(fd), mode_(mode) {
    send_.source = std::move(send);
    recv_.source = std::move(recv);
    in_.resize(4 * kFrameMax);
    out_.resize(4 * kFrameMax);
    if (!send_.cipher.ok() || !recv_.cipher.ok()) {
        error_ = "cannot set up AES-GCM";
        return;
    }
    if (!load_keys(send_, 0) || !load_keys(recv_, 0)) error_ = "cannot derive the frame keys";
}

FrameChannel::~FrameChannel() {
    OPENSSL_cleanse(&send_.keys, sizeof(send_.keys));
    OPENSSL_cleanse(&recv_.keys, sizeof(recv_.keys));
}

bool FrameChannel::load_keys(Direction& d, uint64_t g) {
    if (!d.source || !d.source(g, d.keys)) return false;
    d.generation = g;
    return d.cipher.set_key(d.keys.key);
}

bool FrameChannel::advance(Direction& d) {
    ++d.seq;
    if (d.seq % frames_per_key_ != 0) return true;
    return load_keys(d, d.generation + 1);
}

void FrameChannel::nonce(const Direction& d, uint8_t out[kFrameIvBytes]) const {
    std::memcpy(out, d.keys.iv, kFrameIvBytes);
    for (int i = 0; i < 8; ++i) out[kFrameIvBytes - 1 - i] ^= uint8_t(d.seq >> (8 * i));
}

ssize_t FrameChannel::failed(const std::string& why) {
    if (error_.empty()) error_ = why;
    return -1;
}

ssize_t FrameChannel::write(const void* p, size_t n) {
    if (!error_.empty()) return -1;
    if (n == 0) return 0;
    const size_t len = std::min(n, kMaxFrameData);
    const size_t frame = kFrameHeaderBytes + len + kFrameTagBytes;
    if (out_.size() - out_end_ < frame) {
        const int out = flush_output();
        if (out < 0) return -1;
        if (out == 0) return 0;
    }
    uint8_t* f = out_.data() + out_end_;
    const uint32_t len32 = uint32_t(len);
    std::memcpy(f, &len32, kFrameHeaderBytes);
    uint8_t iv[kFrameIvBytes];
    nonce(send_, iv);
    if (!send_.cipher.seal(mode_, iv, f, kFrameHeaderBytes, p, len)) return failed("AES-GCM failed");
    out_end_ += frame;
    if (!advance(send_)) return failed("cannot derive the next frame keys");
    return ssize_t(len);
}

int FrameChannel::flush_output() {
    if (!error_.empty()) return -1;
    while (out_pos_ < out_end_) {
        const ssize_t w = ::send(fd_, out_.data() + out_pos_, out_end_ - out_pos_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            if (errno == EPIPE || errno == ECONNRESET) closed_ = true;
            return int(failed(closed_ ? "the peer closed the connection" : std::string("socket: ") + strerror(errno)));
        }
        out_pos_ += size_t(w);
    }
    out_pos_ = out_end_ = 0;
    return 1;
}

bool FrameChannel::open_frame() {
    const size_t have = in_end_ - in_pos_;
    if (have < kFrameHeaderBytes) return false;
    uint8_t* f = in_.data() + in_pos_;
    const uint32_t len = get_u32(f);
    if (len == 0 || len > kMaxFrameData) {
        tampered_ = true;
        failed("a frame of " + std::to_string(len) + " bytes (a changed byte?)");
        return false;
    }
    if (have < kFrameHeaderBytes + len + kFrameTagBytes) return false;
    uint8_t iv[kFrameIvBytes];
    nonce(recv_, iv);
    if (!recv_.cipher.open(mode_, iv, f, kFrameHeaderBytes, len)) {
        tampered_ = true;
        failed(mode_ == CryptoMode::Encrypt ? "a frame failed its authentication (bad tag)"
                                            : "a frame failed its integrity check (bad tag)");
        return false;
    }
    if (!advance(recv_)) {
        failed("cannot derive the next frame keys");
        return false;
    }
    plain_pos_ = in_pos_ + kFrameHeaderBytes;
    plain_end_ = plain_pos_ + len;
    in_pos_ = plain_end_ + kFrameTagBytes;
    return true;
}

ssize_t FrameChannel::read(void* p, size_t n) {
    for (;;) {
        if (!error_.empty()) return -1;
        if (plain_pos_ < plain_end_) {
            const size_t k = std::min(n, plain_end_ - plain_pos_);
            std::memcpy(p, in_.data() + plain_pos_, k);
            plain_pos_ += k;
            return ssize_t(k);
        }
        if (open_frame()) continue;
        if (!error_.empty()) return -1;
        // Room for at least one whole frame after what is buffered.
        if (in_.size() - in_end_ < kFrameMax) {
            std::memmove(in_.data(), in_.data() + in_pos_, in_end_ - in_pos_);
            in_end_ -= in_pos_;
            in_pos_ = plain_pos_ = plain_end_ = 0;
        }
        ssize_t r = ::recv(fd_, in_.data() + in_end_, in_.size() - in_end_, MSG_DONTWAIT);
        if (r == 0) {
            closed_ = true;
            return failed("the peer closed the connection");
        }
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR) return 0;
            return failed(std::string("socket: ") + strerror(errno));
        }
        in_end_ += size_t(r);
    }
}

bool FrameChannel::buffered() const {
    if (plain_pos_ < plain_end_) return true;
    const size_t have = in_end_ - in_pos_;
    return have >= kFrameHeaderBytes && have >= kFrameHeaderBytes + get_u32(in_.data() + in_pos_) + kFrameTagBytes;
}

}  // namespace vrdma::shim::fabric
