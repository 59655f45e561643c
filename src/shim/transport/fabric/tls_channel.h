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
// - It carries the handshake and the Hellos only. Neither end reads a byte
//   past the Hello record (no read-ahead): the socket's next bytes are the
//   first frame of a FrameChannel (frame_channel.h), keyed from this
//   session's exporter (export_keys()).
#pragma once

#include <openssl/ssl.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fabric_key.h"
#include "frame_channel.h"

namespace vrdma::shim::fabric {

// One SSL_CTX for both roles, holding the PSK.
class TlsContext {
public:
    TlsContext() = default;
    TlsContext(const TlsContext&) = delete;
    TlsContext& operator=(const TlsContext&) = delete;
    ~TlsContext();
    // False with a one-line reason if OpenSSL refuses the settings. `mode`
    // is what the frames after the handshake protect (kept for the links).
    bool init(const FabricKey& key, CryptoMode mode, std::string& error);
    CryptoMode mode() const { return mode_; }
    SSL_CTX* ctx() const { return ctx_; }
    // A session holding the PSK (for OpenSSL's PSK callbacks; owned by the caller).
    SSL_SESSION* psk_session(SSL* ssl) const;

private:
    SSL_CTX* ctx_ = nullptr;
    CryptoMode mode_ = CryptoMode::Encrypt;
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
    // Bytes received and decrypted wait inside OpenSSL (epoll will not say so).
    bool buffered() const;
    bool closed() const { return closed_; }
    const std::string& error() const { return error_; }
    // A received record failed its authentication (a changed byte).
    bool tampered() const { return tampered_; }
    // RFC 8446 exporter: keys both ends derive from this session, for
    // `label` and a context of 8 bytes (big-endian `context`).
    bool export_keys(const char* label, uint64_t context, uint8_t* out, size_t n) const;
    // One direction's frame keys in `mode` (frame_channel.h), from the
    // exporter with a label per mode and direction, the generation as
    // context: the dialer's sending direction if `from_dialer`. The
    // source refers to this channel, which must outlive it.
    FrameKeySource frame_keys(CryptoMode mode, bool from_dialer) const;

private:
    // The outcome of an SSL call that returned `rc` <= 0.
    ssize_t fail(int rc);

    SSL* ssl_ = nullptr;
    bool done_ = false;
    bool want_write_ = false;
    bool closed_ = false;
    bool tampered_ = false;
    std::string error_;
};

}  // namespace vrdma::shim::fabric
