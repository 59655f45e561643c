#include "integrity_channel.h"

#include <sys/socket.h>

#include <openssl/crypto.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace vrdma::shim::fabric {
namespace {

constexpr size_t kHdrBytes = 4;
constexpr size_t kFrameMax = kHdrBytes + kMaxFrameData + kIntegrityTagBytes;

uint32_t get_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

}  // namespace

IntegrityChannel::IntegrityChannel(int fd, const IntegrityKeys& send, const IntegrityKeys& recv)
    : fd_(fd), send_(send), recv_(recv), seal_(EVP_CIPHER_CTX_new()), open_(EVP_CIPHER_CTX_new()) {
    in_.resize(4 * kFrameMax);
    out_.resize(4 * kFrameMax);
    if (!seal_ || !open_ || EVP_EncryptInit_ex(seal_, EVP_aes_128_gcm(), nullptr, send_.key, nullptr) != 1 ||
        EVP_DecryptInit_ex(open_, EVP_aes_128_gcm(), nullptr, recv_.key, nullptr) != 1)
        error_ = "cannot set up AES-GCM";
}

IntegrityChannel::~IntegrityChannel() {
    EVP_CIPHER_CTX_free(seal_);
    EVP_CIPHER_CTX_free(open_);
    OPENSSL_cleanse(&send_, sizeof(send_));
    OPENSSL_cleanse(&recv_, sizeof(recv_));
}

void IntegrityChannel::nonce(const IntegrityKeys& k, uint64_t seq, uint8_t out[kIntegrityIvBytes]) const {
    std::memcpy(out, k.iv, kIntegrityIvBytes);
    for (int i = 0; i < 8; ++i) out[kIntegrityIvBytes - 1 - i] ^= uint8_t(seq >> (8 * i));
}

// GCM with no plaintext: the tag authenticates hdr | data (GMAC).
bool IntegrityChannel::tag(EVP_CIPHER_CTX* c, bool seal, const IntegrityKeys& k, uint64_t seq, const uint8_t* hdr,
                           const uint8_t* data, size_t n, uint8_t* tag_io) {
    uint8_t iv[kIntegrityIvBytes];
    nonce(k, seq, iv);
    int outl = 0;
    uint8_t none[16];
    if (seal) {
        return EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, iv) == 1 &&
               EVP_EncryptUpdate(c, nullptr, &outl, hdr, int(kHdrBytes)) == 1 &&
               EVP_EncryptUpdate(c, nullptr, &outl, data, int(n)) == 1 && EVP_EncryptFinal_ex(c, none, &outl) == 1 &&
               EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, int(kIntegrityTagBytes), tag_io) == 1;
    }
    return EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, iv) == 1 &&
           EVP_DecryptUpdate(c, nullptr, &outl, hdr, int(kHdrBytes)) == 1 &&
           EVP_DecryptUpdate(c, nullptr, &outl, data, int(n)) == 1 &&
           EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, int(kIntegrityTagBytes), tag_io) == 1 &&
           EVP_DecryptFinal_ex(c, none, &outl) == 1;
}

ssize_t IntegrityChannel::failed(const std::string& why) {
    if (error_.empty()) error_ = why;
    return -1;
}

ssize_t IntegrityChannel::write(const void* p, size_t n) {
    if (!error_.empty()) return -1;
    if (n == 0) return 0;
    const size_t len = std::min(n, kMaxFrameData);
    const size_t frame = kHdrBytes + len + kIntegrityTagBytes;
    if (out_.size() - out_end_ < frame) {
        const int out = flush_output();
        if (out < 0) return -1;
        if (out == 0) return 0;
    }
    uint8_t* f = out_.data() + out_end_;
    const uint32_t len32 = uint32_t(len);
    std::memcpy(f, &len32, kHdrBytes);
    std::memcpy(f + kHdrBytes, p, len);
    if (!tag(seal_, true, send_, send_seq_, f, f + kHdrBytes, len, f + kHdrBytes + len))
        return failed("AES-GCM failed");
    out_end_ += frame;
    ++send_seq_;
    return ssize_t(len);
}

int IntegrityChannel::flush_output() {
    if (!error_.empty()) return -1;
    while (out_pos_ < out_end_) {
        const ssize_t w = ::send(fd_, out_.data() + out_pos_, out_end_ - out_pos_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_write_ = true;
                return 0;
            }
            if (errno == EPIPE || errno == ECONNRESET) closed_ = true;
            return int(failed(closed_ ? "the peer closed the connection" : std::string("socket: ") + strerror(errno)));
        }
        out_pos_ += size_t(w);
    }
    out_pos_ = out_end_ = 0;
    want_write_ = false;
    return 1;
}

bool IntegrityChannel::open_frame() {
    const size_t have = in_end_ - in_pos_;
    if (have < kHdrBytes) return false;
    const uint8_t* f = in_.data() + in_pos_;
    const uint32_t len = get_u32(f);
    if (len == 0 || len > kMaxFrameData) {
        tampered_ = true;
        failed("a frame of " + std::to_string(len) + " bytes (a changed byte?)");
        return false;
    }
    if (have < kHdrBytes + len + kIntegrityTagBytes) return false;
    uint8_t t[kIntegrityTagBytes];
    std::memcpy(t, f + kHdrBytes + len, kIntegrityTagBytes);
    if (!tag(open_, false, recv_, recv_seq_, f, f + kHdrBytes, len, t)) {
        tampered_ = true;
        failed("a frame failed its integrity check (bad tag)");
        return false;
    }
    ++recv_seq_;
    plain_pos_ = in_pos_ + kHdrBytes;
    plain_end_ = plain_pos_ + len;
    in_pos_ = plain_end_ + kIntegrityTagBytes;
    return true;
}

ssize_t IntegrityChannel::read(void* p, size_t n) {
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

bool IntegrityChannel::buffered() const {
    if (plain_pos_ < plain_end_) return true;
    const size_t have = in_end_ - in_pos_;
    return have >= kHdrBytes && have >= kHdrBytes + get_u32(in_.data() + in_pos_) + kIntegrityTagBytes;
}

}  // namespace vrdma::shim::fabric
