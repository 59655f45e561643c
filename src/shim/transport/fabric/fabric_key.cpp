#include "fabric_key.h"

#include <openssl/evp.h>
#include <openssl/kdf.h>
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

void FabricKey::set(const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    key_.assign(b, b + n);
}

bool FabricKey::derive(const char* label, uint8_t out[kPskBytes]) const {
    EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
    size_t len = kPskBytes;
    bool ok = ctx && EVP_PKEY_derive_init(ctx) > 0 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) > 0 &&
              EVP_PKEY_CTX_set1_hkdf_key(ctx, key_.data(), int(key_.size())) > 0 &&
              EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const unsigned char*>(label), int(std::strlen(label))) >
                  0 &&
              EVP_PKEY_derive(ctx, out, &len) > 0 && len == kPskBytes;
    EVP_PKEY_CTX_free(ctx);
    return ok;
}

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
