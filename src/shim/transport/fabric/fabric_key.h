// The fabric's shared secret (--fabric-key FILE) and the proof of knowing
// it: HMAC-SHA256 over both ends' handshake messages. The key never leaves
// the shim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vrdma::shim::fabric {

class FabricKey {
public:
    // Reads the key file: its bytes (a trailing newline is not part of the
    // key), at least 16. False with a one-line reason otherwise. Warns when
    // the file can be read by other users.
    bool load(const std::string& path, std::string& error);
    bool empty() const { return key_.empty(); }
    // HMAC-SHA256(key, label | a | b) into out[32].
    void mac(const char* label, const void* a, size_t alen, const void* b, size_t blen, uint8_t out[32]) const;

private:
    std::vector<uint8_t> key_;
};

// Constant-time comparison of two MACs.
bool mac_equal(const uint8_t a[32], const uint8_t b[32]);

// Fills `out` from the kernel's random source.
void random_bytes(void* out, size_t n);

}  // namespace vrdma::shim::fabric
