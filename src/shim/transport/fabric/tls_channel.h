// The secure channel between two shims: TLS 1.3 (OpenSSL) with the fabric
// key as an external pre-shared key (docs/protocol.md "Fabric").
//
// - The PSK is HKDF-SHA256 of the key file's bytes with a label; the key
//   exchange mode is psk_dhe_ke (an ephemeral X25519 or P-256 exchange as
//   well: a key leaked later does not open recorded sessions); the only
//   cipher suite is TLS_AES_128_GCM_SHA256; no certificates, no session
//   tickets, no early data (nothing a recording could replay).
// - The dialer is the TLS client, the listener the server: the handshake
//   transcript binds both roles and this one connection, so a relay that
//   does not know the key can neither finish it nor change a byte after it.
// - Non-blocking: handshake(), read() and write() never wait; they say
//   whether the socket must become readable or writable first.
// - Where the kernel has the tls ULP (encrypt mode), OpenSSL hands it the
//   record keys (kTLS) and works on the socket itself. Elsewhere records
//   pass through a memory BIO pair that this class fills and empties with
//   large socket calls: OpenSSL alone writes and reads one 16 KiB record
//   per system call, and on a veth that costs 4x in bandwidth against
//   256 KiB calls (iperf3 -l 16K against -l 256K, docs/performance.md).
//   Integrity mode stays on the socket: it must read no byte past the
//   Hello record, after which the socket carries its own frames.
#pragma once

#include <openssl/ssl.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fabric_key.h"

namespace vrdma::shim::fabric {

// --fabric-crypto: what the channel protects after the handshake.
enum class CryptoMode : uint8_t {
    Encrypt = 1,    // TLS records: confidentiality, integrity, replay
    Integrity = 2,  // AES-GCM tags over cleartext frames (integrity_frame.h)
};
const char* crypto_mode_name(CryptoMode m);
bool parse_crypto_mode(const std::string& text, CryptoMode& out);

// One SSL_CTX for both roles, holding the PSK.
class TlsContext {
public:
    TlsContext() = default;
    TlsContext(const TlsContext&) = delete;
    TlsContext& operator=(const TlsContext&) = delete;
    ~TlsContext();
    // False with a one-line reason if OpenSSL refuses the settings.
    bool init(const FabricKey& key, CryptoMode mode, std::string& error);
    CryptoMode mode() const { return mode_; }
    SSL_CTX* ctx() const { return ctx_; }
    // The records go through a BIO pair (no kTLS to hand them to).
    bool batched() const { return batched_; }
    // A session holding the PSK (for OpenSSL's PSK callbacks; owned by the caller).
    SSL_SESSION* psk_session(SSL* ssl) const;

private:
    SSL_CTX* ctx_ = nullptr;
    CryptoMode mode_ = CryptoMode::Encrypt;
    bool batched_ = false;
    uint8_t psk_[kPskBytes] = {};
};

class TlsChannel {
public:
    // `client`: this side dialed. The fd stays owned by the caller.
    TlsChannel(const TlsContext& tls, int fd, bool client);
    TlsChannel(const TlsChannel&) = delete;
    TlsChannel& operator=(const TlsChannel&) = delete;
    ~TlsChannel();

    enum class Step { Done, Again, Failed };
    // Drives the handshake. Failed: error() says why.
    Step handshake();
    bool handshake_done() const { return done_; }
    // >0: bytes moved; 0: the socket must become ready first (want_write()
    // tells which way); -1: the connection ended (closed() if cleanly, by
    // the peer) or failed (error()).
    ssize_t write(const void* p, size_t n);
    ssize_t read(void* p, size_t n);
    // The last call stopped because the socket was full.
    bool want_write() const { return want_write_; }
    // Sends the records written so far (batched channels hold them until
    // this is called or a batch is full): 1 all out, 0 the socket is full
    // (want_write()), -1 failed (error()).
    int flush_output();
    // Records wait for flush_output().
    bool output_pending() const;
    // Decrypted or received bytes wait inside OpenSSL (epoll will not say so).
    bool buffered() const;
    bool closed() const { return closed_; }
    const std::string& error() const { return error_; }
    // A received record failed its authentication (a changed byte).
    bool tampered() const { return tampered_; }
    // Whether the kernel took the record layer (kTLS) for sending/receiving.
    bool ktls_send() const;
    bool ktls_recv() const;
    // RFC 8446 exporter: keys both ends derive from this session.
    bool export_keys(const char* label, uint8_t* out, size_t n) const;
    // Records in user space change their sending key (a TLS KeyUpdate)
    // after this many bytes: AES-GCM's safety margin in RFC 8446 5.5 is
    // about 2^24.5 full records (about 380 GB) per key, a few minutes of
    // a busy link. The default is 2^36 bytes; tests set less.
    void set_rekey_bytes(uint64_t n) { rekey_bytes_ = n; }
    uint64_t key_updates() const { return key_updates_; }

private:
    // The outcome of an SSL call that returned `rc` <= 0.
    ssize_t fail(int rc);
    // Batched channels: socket -> pair (>0 bytes, 0 nothing now, -1 end or
    // error) and pair -> socket (as flush_output).
    ssize_t pump_in();
    int pump_out();
    // A socket error or end of stream seen by the pumps.
    ssize_t socket_failed(int err);

    SSL* ssl_ = nullptr;
    BIO* net_ = nullptr;  // batched: this class's end of the pair
    int fd_ = -1;
    bool done_ = false;
    bool want_write_ = false;
    bool closed_ = false;
    bool tampered_ = false;
    uint64_t rekey_bytes_ = uint64_t(1) << 36;
    uint64_t sent_under_key_ = 0, key_updates_ = 0;
    std::string error_;
};

}  // namespace vrdma::shim::fabric
