#include "tls_channel.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vrdma::shim::fabric {
namespace {

// Both ends derive the PSK from the key file with this label, and name it
// with this identity (a change of either is a new, incompatible protocol).
constexpr const char* kPskLabel = "vrdma fabric tls13 external psk v1";
constexpr const char* kPskIdentity = "vrdma-fabric-v1";
constexpr unsigned char kAes128GcmSha256[2] = {0x13, 0x01};

// Each direction of a batched channel's BIO pair: what one send or recv
// moves at most (256 KiB calls reach the veth's full rate, 16 KiB calls a
// quarter of it).
constexpr size_t kPairBytes = 256 * 1024;

// Whether this kernel has the tls ULP: an unconnected TCP socket gets
// ENOTCONN from it, ENOENT where there is no such module.
bool kernel_has_ktls() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const int rc = ::setsockopt(fd, IPPROTO_TCP, TCP_ULP, "tls", sizeof("tls"));
    const int err = errno;
    ::close(fd);
    return rc == 0 || err == ENOTCONN;
}

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
    if (mode == CryptoMode::Encrypt) {
        // Where the kernel has the tls ULP, it gets the record keys and the
        // data path stays plain socket calls; elsewhere the records are
        // batched (tls_channel.h).
        batched_ = !kernel_has_ktls();
        if (!batched_) SSL_CTX_set_options(ctx_, SSL_OP_ENABLE_KTLS);
        // One read syscall brings a record's header and body (and what
        // follows, up to the read buffer's size). The buffer stays at its
        // default (one record): OpenSSL moves the unread rest of it to the
        // front at each record, so a large one costs a copy of up to its
        // size per 16 KiB (measured: 27% of the receiving shim in memmove
        // with 256 KiB).
        SSL_CTX_set_read_ahead(ctx_, 1);
    }
    // Integrity mode reads no byte past the Hello record: the socket's next
    // bytes are the first frame (integrity_frame.h).
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

TlsChannel::TlsChannel(const TlsContext& tls, int fd, bool client) : fd_(fd) {
    ssl_ = SSL_new(tls.ctx());
    bool ok = ssl_ != nullptr;
    if (ok && tls.batched()) {
        BIO* inner = nullptr;
        ok = BIO_new_bio_pair(&inner, kPairBytes, &net_, kPairBytes) == 1;
        if (ok) SSL_set_bio(ssl_, inner, inner);
    } else if (ok) {
        ok = SSL_set_fd(ssl_, fd) == 1;
    }
    if (!ok) {
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

TlsChannel::~TlsChannel() {
    SSL_free(ssl_);  // and the pair's inner end
    BIO_free(net_);
}

ssize_t TlsChannel::socket_failed(int err) {
    closed_ = err == 0 || err == ECONNRESET || err == EPIPE;
    error_ = closed_ ? "the peer closed the connection" : std::string("socket: ") + strerror(err);
    return -1;
}

ssize_t TlsChannel::pump_in() {
    char* room = nullptr;
    const int n = BIO_nwrite0(net_, &room);
    if (n <= 0) return 0;  // full: OpenSSL reads from it first
    for (;;) {
        const ssize_t r = ::recv(fd_, room, size_t(n), MSG_DONTWAIT);
        if (r > 0) {
            BIO_nwrite(net_, &room, int(r));
            return r;
        }
        if (r == 0) return socket_failed(0);
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return socket_failed(errno);
    }
}

int TlsChannel::pump_out() {
    for (;;) {
        char* data = nullptr;
        const int n = BIO_nread0(net_, &data);
        if (n <= 0) {
            want_write_ = false;
            return 1;
        }
        const ssize_t w = ::send(fd_, data, size_t(n), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_write_ = true;
                return 0;
            }
            return int(socket_failed(errno));
        }
        BIO_nread(net_, &data, int(w));
    }
}

int TlsChannel::flush_output() {
    if (!net_ || !ssl_) return 1;
    return pump_out();
}

bool TlsChannel::output_pending() const { return net_ && BIO_ctrl_pending(net_) > 0; }

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
    for (;;) {
        ERR_clear_error();
        const int rc = SSL_do_handshake(ssl_);
        if (net_ && pump_out() < 0) return Step::Failed;
        if (rc == 1) {
            done_ = true;
            want_write_ = output_pending();
            return Step::Done;
        }
        if (net_ && SSL_get_error(ssl_, rc) == SSL_ERROR_WANT_READ) {
            const ssize_t r = pump_in();
            if (r > 0) continue;
            ERR_clear_error();
            return r == 0 ? Step::Again : Step::Failed;
        }
        return fail(rc) == 0 ? Step::Again : Step::Failed;
    }
}

ssize_t TlsChannel::write(const void* p, size_t n) {
    if (n == 0) return 0;
    for (bool retried = false;; retried = true) {
        ERR_clear_error();
        size_t done = 0;
        const int rc = SSL_write_ex(ssl_, p, n, &done);
        if (rc == 1) {
            if (!net_) want_write_ = false;
            sent_under_key_ += done;
            // (The KeyUpdate goes out before the next record.)
            if (sent_under_key_ >= rekey_bytes_ && !ktls_send() &&
                SSL_key_update(ssl_, SSL_KEY_UPDATE_NOT_REQUESTED) == 1) {
                sent_under_key_ = 0;
                ++key_updates_;
            }
            return ssize_t(done);
        }
        // Batched: the pair is full; it goes to the socket, and the
        // record once more into the room that made.
        if (!net_ || retried || SSL_get_error(ssl_, rc) != SSL_ERROR_WANT_WRITE) return fail(rc);
        if (pump_out() < 0) return -1;
    }
}

ssize_t TlsChannel::read(void* p, size_t n) {
    for (;;) {
        ERR_clear_error();
        size_t done = 0;
        const int rc = SSL_read_ex(ssl_, p, n, &done);
        if (rc == 1) {
            if (!net_) want_write_ = false;
            return ssize_t(done);
        }
        if (!net_ || SSL_get_error(ssl_, rc) != SSL_ERROR_WANT_READ) return fail(rc);
        const ssize_t r = pump_in();
        if (r > 0) continue;
        ERR_clear_error();
        return r;
    }
}

bool TlsChannel::buffered() const {
    return ssl_ && (SSL_pending(ssl_) > 0 || SSL_has_pending(ssl_) ||
                    (net_ && BIO_ctrl_pending(SSL_get_rbio(ssl_)) > 0));
}

bool TlsChannel::ktls_send() const { return ssl_ && BIO_get_ktls_send(SSL_get_wbio(ssl_)); }
bool TlsChannel::ktls_recv() const { return ssl_ && BIO_get_ktls_recv(SSL_get_rbio(ssl_)); }

bool TlsChannel::export_keys(const char* label, uint8_t* out, size_t n) const {
    return ssl_ && done_ &&
           SSL_export_keying_material(ssl_, out, n, label, std::strlen(label), nullptr, 0, 0) == 1;
}

}  // namespace vrdma::shim::fabric
