#include "frame_cipher.h"

#include <openssl/crypto.h>
#include <nettle/memops.h>

#include <cstring>

namespace vrdma::shim::fabric {

bool FrameCipher::nettle_usable() {
#if defined(__x86_64__)
    static const bool usable = __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
    return usable;
#else
    return false;
#endif
}

FrameCipher::FrameCipher(bool sealing)
    : sealing_(sealing), small_by_nettle_(nettle_usable() && EVP_default_properties_is_fips_enabled(nullptr) != 1) {
    EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
    if (!c) return;
    const int r = sealing ? EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), nullptr, nullptr, nullptr)
                          : EVP_DecryptInit_ex(c, EVP_aes_128_gcm(), nullptr, nullptr, nullptr);
    if (r != 1) {
        EVP_CIPHER_CTX_free(c);
        return;
    }
    evp_ = c;
}

FrameCipher::~FrameCipher() {
    EVP_CIPHER_CTX_free(evp_);
    OPENSSL_cleanse(&nettle_, sizeof(nettle_));  // the expanded key
}

bool FrameCipher::set_key(const uint8_t key[kFrameKeyBytes]) {
    if (!evp_) return false;
    gcm_aes128_set_key(&nettle_, key);
    return sealing_ ? EVP_EncryptInit_ex(evp_, nullptr, nullptr, key, nullptr) == 1
                    : EVP_DecryptInit_ex(evp_, nullptr, nullptr, key, nullptr) == 1;
}

bool FrameCipher::uses_nettle(size_t n) const {
    switch (impl_) {
        case Impl::OpenSsl:
            return false;
        case Impl::Nettle:
            return true;
        case Impl::Auto:
            break;
    }
    return n <= kSmallFrameBytes && small_by_nettle_;
}

bool FrameCipher::seal(CryptoMode mode, const uint8_t iv[kFrameIvBytes], uint8_t* f, size_t header,
                       const void* src, size_t n) {
    return uses_nettle(n) ? seal_nettle(mode, iv, f, header, src, n) : seal_openssl(mode, iv, f, header, src, n);
}

bool FrameCipher::open(CryptoMode mode, const uint8_t iv[kFrameIvBytes], uint8_t* f, size_t header, size_t n) {
    return uses_nettle(n) ? open_nettle(mode, iv, f, header, n) : open_openssl(mode, iv, f, header, n);
}

bool FrameCipher::seal_openssl(CryptoMode mode, const uint8_t* iv, uint8_t* f, size_t header, const void* src,
                               size_t n) {
    uint8_t* data = f + header;
    uint8_t none[16];
    int outl = 0;
    if (EVP_EncryptInit_ex(evp_, nullptr, nullptr, nullptr, iv) != 1 ||
        EVP_EncryptUpdate(evp_, nullptr, &outl, f, int(header)) != 1)
        return false;
    if (mode == CryptoMode::Encrypt) {
        // One pass from the guest's memory to the ciphertext.
        if (EVP_EncryptUpdate(evp_, data, &outl, static_cast<const uint8_t*>(src), int(n)) != 1) return false;
    } else {
        std::memcpy(data, src, n);
        if (EVP_EncryptUpdate(evp_, nullptr, &outl, data, int(n)) != 1) return false;
    }
    return EVP_EncryptFinal_ex(evp_, none, &outl) == 1 &&
           EVP_CIPHER_CTX_ctrl(evp_, EVP_CTRL_GCM_GET_TAG, int(kFrameTagBytes), data + n) == 1;
}

bool FrameCipher::open_openssl(CryptoMode mode, const uint8_t* iv, uint8_t* f, size_t header, size_t n) {
    uint8_t* data = f + header;
    uint8_t none[16];
    int outl = 0;
    return EVP_DecryptInit_ex(evp_, nullptr, nullptr, nullptr, iv) == 1 &&
           EVP_DecryptUpdate(evp_, nullptr, &outl, f, int(header)) == 1 &&
           EVP_DecryptUpdate(evp_, mode == CryptoMode::Encrypt ? data : nullptr, &outl, data, int(n)) == 1 &&
           EVP_CIPHER_CTX_ctrl(evp_, EVP_CTRL_GCM_SET_TAG, int(kFrameTagBytes), data + n) == 1 &&
           EVP_DecryptFinal_ex(evp_, none, &outl) == 1;
}

bool FrameCipher::seal_nettle(CryptoMode mode, const uint8_t* iv, uint8_t* f, size_t header, const void* src,
                              size_t n) {
    uint8_t* data = f + header;
    gcm_aes128_set_iv(&nettle_, kFrameIvBytes, iv);
    if (mode == CryptoMode::Encrypt) {
        gcm_aes128_update(&nettle_, header, f);
        // The tag covers the ciphertext nettle wrote, not the guest's memory.
        gcm_aes128_encrypt(&nettle_, n, data, static_cast<const uint8_t*>(src));
    } else {
        // Header and data are contiguous: one pass of authenticated data.
        std::memcpy(data, src, n);
        gcm_aes128_update(&nettle_, header + n, f);
    }
    gcm_aes128_digest(&nettle_, kFrameTagBytes, data + n);
    return true;
}

bool FrameCipher::open_nettle(CryptoMode mode, const uint8_t* iv, uint8_t* f, size_t header, size_t n) {
    uint8_t* data = f + header;
    uint8_t tag[kFrameTagBytes];
    gcm_aes128_set_iv(&nettle_, kFrameIvBytes, iv);
    if (mode == CryptoMode::Encrypt) {
        gcm_aes128_update(&nettle_, header, f);
        gcm_aes128_decrypt(&nettle_, n, data, data);
    } else {
        gcm_aes128_update(&nettle_, header + n, f);
    }
    gcm_aes128_digest(&nettle_, kFrameTagBytes, tag);
    // (A bad frame's decrypted bytes stay in the buffer: FrameChannel hands
    // on nothing of a frame that failed, and the channel ends.)
    return memeql_sec(tag, data + n, kFrameTagBytes) != 0;
}

}  // namespace vrdma::shim::fabric
