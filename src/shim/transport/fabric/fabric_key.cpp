#include "fabric_key.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "vrdma_common/log.h"

namespace vrdma::shim::fabric {

bool FabricKey::load(const std::string& path, std::string& error) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        error = "cannot read the fabric key file '" + path + "': " + strerror(errno);
        return false;
    }
    std::vector<uint8_t> k((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    while (!k.empty() && (k.back() == '\n' || k.back() == '\r')) k.pop_back();
    if (k.size() < 16) {
        error = "the fabric key file '" + path + "' holds " + std::to_string(k.size()) +
                " bytes; a key needs at least 16 (for example: head -c 32 /dev/urandom | base64 > FILE)";
        return false;
    }
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 0077))
        LOG_WARN("fabric: the key file %s can be read by other users (mode %03o): chmod 600 it", path.c_str(),
                 unsigned(st.st_mode & 0777));
    key_ = std::move(k);
    return true;
}

void FabricKey::mac(const char* label, const void* a, size_t alen, const void* b, size_t blen,
                    uint8_t out[32]) const {
    std::vector<uint8_t> msg;
    msg.reserve(std::strlen(label) + alen + blen);
    msg.insert(msg.end(), label, label + std::strlen(label));
    msg.insert(msg.end(), static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(a) + alen);
    msg.insert(msg.end(), static_cast<const uint8_t*>(b), static_cast<const uint8_t*>(b) + blen);
    unsigned int len = 32;
    HMAC(EVP_sha256(), key_.data(), int(key_.size()), msg.data(), msg.size(), out, &len);
}

bool mac_equal(const uint8_t a[32], const uint8_t b[32]) { return CRYPTO_memcmp(a, b, 32) == 0; }

void random_bytes(void* out, size_t n) {
    auto* p = static_cast<uint8_t*>(out);
    while (n > 0) {
        ssize_t r = ::getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            std::abort();  // no random source: nothing about the fabric can be trusted
        }
        p += r;
        n -= size_t(r);
    }
}

}  // namespace vrdma::shim::fabric
