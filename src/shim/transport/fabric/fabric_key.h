// The fabric's shared secret (--fabric-key FILE). The file's bytes are never
// used as a key themselves: the TLS pre-shared key is derived from them with
// HKDF-SHA256 and a label (tls_channel.h), and the key never leaves the shim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vrdma::shim::fabric {

constexpr size_t kPskBytes = 32;

class FabricKey {
public:
    // Reads the key file: its bytes (a trailing newline is not part of the
    // key), at least 16. False with a one-line reason otherwise. Warns when
    // the file can be read by other users.
    bool load(const std::string& path, std::string& error);
    // Sets the key from bytes (tests).
    void set(const void* p, size_t n);
    bool empty() const { return key_.empty(); }
    // HKDF-SHA256(key, info = `label`) into out[kPskBytes]. False only if
    // OpenSSL fails.
    bool derive(const char* label, uint8_t out[kPskBytes]) const;

private:
    std::vector<uint8_t> key_;
};

// Fills `out` from the kernel's random source.
void random_bytes(void* out, size_t n);

}  // namespace vrdma::shim::fabric
