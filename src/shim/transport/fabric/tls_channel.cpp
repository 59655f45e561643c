#include "tls_channel.h"

#include <openssl/err.h>
#include <signal.h>

#include <cerrno>
#include <cstring>

namespace vrdma::shim::fabric {
namespace {

// Both ends derive the PSK from the key file with this label, and name it
// with this identity (a change of either is a new, incompatible protocol).
constexpr const char* kPskLabel = "vrdma fabric tls13 external psk v1";
constexpr const char* kPskIdentity = "vrdma-fabric-v1";
constexpr unsigned char kAes128GcmSha256[2] = {0x13, 0x01};
// The exporter labels of the frame keys, per mode and direction (a key of
// one mode or direction is never a key of another).
constexpr const char* kFrameLabels[2][2] = {
    {"EXPORTER-vrdma-encrypt-dialer-to-listener", "EXPORTER-vrdma-encrypt-listener-to-dialer"},
    {"EXPORTER-vrdma-integrity-dialer-to-listener", "EXPORTER-vrdma-integrity-listener-to-dialer"},
};

// The newest OpenSSL error, as text (the queue is emptied).
std::string ssl_error_text() {
    unsigned long e, last = 0;
    while ((e = ERR_get_error()) != 0) last = e;
    if (!last) return {};
    const char* reason = ERR_reason_error_string(last);
    return reason ? reason : "TLS error " + std::to_string(last);
}

const TlsContext* context_of(SSL* ssl) {
    return static_cast<const TlsContext*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
}

int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen, SSL_SESSION** sess) {
    *id = nullptr;
    *idlen = 0;
    *sess = nullptr;
    SSL_SESSION* s = context_of(ssl)->psk_session(ssl);
    if (!s) return 0;
    if (md && SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s)) != md) {
        SSL_SESSION_free(s);
        return 1;  // not usable in this handshake: there is no other
    }
    *sess = s;
    *id = reinterpret_cast<const unsigned char*>(kPskIdentity);
    *idlen = std::strlen(kPskIdentity);
    return 1;
}

int find_psk(SSL* ssl, const unsigned char* id, size_t idlen, SSL_SESSION** sess) {
    *sess = nullptr;
    if (idlen != std::strlen(kPskIdentity) || std::memcmp(id, kPskIdentity, idlen) != 0)
        return 0;  // no certificates to fall back to: fail at once
    *sess = context_of(ssl)->psk_session(ssl);
    return *sess ? 1 : 0;
}

}  // namespace

TlsContext::~TlsContext() {
    SSL_CTX_free(ctx_);
    OPENSSL_cleanse(psk_, sizeof(psk_));
}

bool TlsContext::init(const FabricKey& key, CryptoMode mode, std::string& error) {
    mode_ = mode;
    // OpenSSL's socket BIO writes with write(2), which cannot say
    // MSG_NOSIGNAL: a peer gone mid-write must be an error, not SIGPIPE.
    struct sigaction sa{};
    if (::sigaction(SIGPIPE, nullptr, &sa) == 0 && sa.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
    if (!key.derive(kPskLabel, psk_)) {
        error = "cannot derive the fabric's TLS key: " + ssl_error_text();
        return false;
    }
    SSL_CTX_free(ctx_);
    ctx_ = SSL_CTX_new(TLS_method());
    bool ok = ctx_ && SSL_CTX_set_min_proto_version(ctx_, TLS1_3_VERSION) == 1 &&
              SSL_CTX_set_max_proto_version(ctx_, TLS1_3_VERSION) == 1 &&
              SSL_CTX_set_ciphersuites(ctx_, "TLS_AES_128_GCM_SHA256") == 1 && SSL_CTX_set_num_tickets(ctx_, 0) == 1;
    if (!ok) {
        error = "cannot set up TLS 1.3: " + ssl_error_text();
        return false;
    }
    SSL_CTX_set_app_data(ctx_, this);
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_NONE, nullptr);  // the PSK authenticates; there are no certificates
    SSL_CTX_set_psk_use_session_callback(ctx_, use_psk);
    SSL_CTX_set_psk_find_session_callback(ctx_, find_psk);
    // No resumption (nothing to replay), no middlebox compatibility records.
    SSL_CTX_set_options(ctx_, SSL_OP_NO_TICKET);
    SSL_CTX_clear_options(ctx_, SSL_OP_ENABLE_MIDDLEBOX_COMPAT | SSL_OP_ALLOW_NO_DHE_KEX);
    SSL_CTX_set_session_cache_mode(ctx_, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_mode(ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    // No read-ahead (OpenSSL's default): the Hello record is the last
    // thing it reads from the socket; the frames follow (frame_channel.h).
    return true;
}

SSL_SESSION* TlsContext::psk_session(SSL* ssl) const {
    const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kAes128GcmSha256);
    SSL_SESSION* s = SSL_SESSION_new();
    if (!cipher || !s || SSL_SESSION_set1_master_key(s, psk_, sizeof(psk_)) != 1 ||
        SSL_SESSION_set_cipher(s, cipher) != 1 || SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
        SSL_SESSION_free(s);
        return nullptr;
    }
    return s;
}

TlsChannel::TlsChannel(const TlsContext& tls, int fd, bool client) {
    ssl_ = SSL_new(tls.ctx());
    if (!ssl_ || SSL_set_fd(ssl_, fd) != 1) {
        error_ = "cannot create a TLS session: " + ssl_error_text();
        SSL_free(ssl_);
        ssl_ = nullptr;
        return;
    }
    if (client)
        SSL_set_connect_state(ssl_);
    else
        SSL_set_accept_state(ssl_);
}

TlsChannel::~TlsChannel() { SSL_free(ssl_); }

ssize_t TlsChannel::fail(int rc) {
    const int e = SSL_get_error(ssl_, rc);
    want_write_ = e == SSL_ERROR_WANT_WRITE;
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        ERR_clear_error();
        return 0;
    }
    if (e == SSL_ERROR_ZERO_RETURN) {
        closed_ = true;
        error_ = "the peer closed the connection";
        return -1;
    }
    const int saved = errno;
    unsigned long top = ERR_peek_last_error();
    if (e == SSL_ERROR_SYSCALL && top == 0) {
        if (saved == EAGAIN || saved == EINTR) return 0;
        closed_ = saved == 0 || saved == ECONNRESET || saved == EPIPE;
        error_ = closed_ ? "the peer closed the connection" : std::string("socket: ") + strerror(saved);
        return -1;
    }
    // Shims end connections without close_notify (a killed one cannot send
    // it): an end of stream between records is a close. The messages cut
    // short by it fail as on any lost connection.
    if (done_ && ERR_GET_REASON(top) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ERR_clear_error();
        closed_ = true;
        error_ = "the peer closed the connection";
        return -1;
    }
    // A record of the peer's that failed here (the peer's own alert about
    // ours is its business: it counts it).
    if (ERR_GET_REASON(top) == SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC) tampered_ = done_;
    error_ = "TLS: " + ssl_error_text();
    return -1;
}

TlsChannel::Step TlsChannel::handshake() {
    if (!ssl_) return Step::Failed;
    if (done_) return Step::Done;
    ERR_clear_error();
    const int rc = SSL_do_handshake(ssl_);
    if (rc == 1) {
        done_ = true;
        want_write_ = false;
        return Step::Done;
    }
    return fail(rc) == 0 ? Step::Again : Step::Failed;
}

ssize_t TlsChannel::write(const void* p, size_t n) {
    if (n == 0) return 0;
    ERR_clear_error();
    size_t done = 0;
    const int rc = SSL_write_ex(ssl_, p, n, &done);
    if (rc != 1) return fail(rc);
    want_write_ = false;
    return ssize_t(done);
}

ssize_t TlsChannel::read(void* p, size_t n) {
    ERR_clear_error();
    size_t done = 0;
    const int rc = SSL_read_ex(ssl_, p, n, &done);
    if (rc != 1) return fail(rc);
    want_write_ = false;
    return ssize_t(done);
}

bool TlsChannel::buffered() const { return ssl_ && (SSL_pending(ssl_) > 0 || SSL_has_pending(ssl_)); }

bool TlsChannel::export_keys(const char* label, uint64_t context, uint8_t* out, size_t n) const {
    uint8_t ctx[8];
    for (int i = 0; i < 8; ++i) ctx[i] = uint8_t(context >> (8 * (7 - i)));
    return ssl_ && done_ &&
           SSL_export_keying_material(ssl_, out, n, label, std::strlen(label), ctx, sizeof(ctx), 1) == 1;
}

FrameKeySource TlsChannel::frame_keys(CryptoMode mode, bool from_dialer) const {
    const char* label = kFrameLabels[mode == CryptoMode::Integrity ? 1 : 0][from_dialer ? 0 : 1];
    return [this, label](uint64_t generation, FrameKeys& k) {
        return export_keys(label, generation, reinterpret_cast<uint8_t*>(&k), sizeof(k));
    };
}

}  // namespace vrdma::shim::fabric
