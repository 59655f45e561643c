// The fabric: this shim and its peer shims, each owning a range of LIDs,
// joined by TLS 1.3 over TCP (docs/protocol.md "Fabric").
//
// Each peer is a Transport: the route table sends every LID the peer owns
// to it, and its connection (link.h) carries the requests and responses of
// all QPs between the two shims. Configured peers (--fabric-peer) are
// dialed and redialed with backoff; any shim that completes the TLS
// handshake (it knows the fabric key) may connect. A peer whose LID range
// overlaps this shim's or another live peer's is refused with the reason,
// on both sides. Handshakes in progress are bounded per source address,
// with a slot always kept for the configured peers' addresses.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric_key.h"
#include "link.h"
#include "tls_channel.h"
#include "transport.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {
class Engine;
}

namespace vrdma::shim::fabric {

struct FabricConfig {
    std::string listen;              // ADDR:PORT, empty: accept nothing
    std::vector<std::string> peers;  // ADDR:PORT each
    std::string key_file;
    CryptoMode crypto = CryptoMode::Encrypt;
    uint16_t lid_first = 0, lid_last = 0;
};

// What the fabric refused, since the shim started (vrdmactl peers).
struct FabricCounters {
    uint64_t handshake_failed = 0;   // TLS handshakes that failed (wrong key, relay, replay, garbage)
    uint64_t handshake_timeout = 0;  // handshakes not done within their deadline
    uint64_t mode_mismatch = 0;      // peers that use the other --fabric-crypto mode
    uint64_t tampered = 0;           // links closed by a record or frame that failed authentication
    uint64_t flood_refused = 0;      // connections closed at once: their source had too many handshakes pending
    uint64_t replace_refused = 0;    // new connections refused: a live link to that peer exists
};

// "a.b.c.d:port" (or "host:port", resolved once) into an IPv4 address.
bool parse_endpoint(const std::string& text, sockaddr_in& out, std::string& error);

class Peer final : public Transport {
public:
    Peer(std::string address, const sockaddr_in& addr, bool configured)
        : address_(std::move(address)), addr_(addr), configured_(configured) {}
    const char* name() const override { return "tcp"; }
    bool keeps_memory() const override { return true; }
    SendResult send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local, uint32_t nlocal,
                    Pins* pins, Response& resp) override;
    bool delivering_since(uint64_t since_ns) const override;
    // Kept from the peer's last Hello: QPs bound to the device do not need
    // the TCP link, and new ones may bind while it is down.
    const uint8_t* device_gid() const override { return has_device_ ? device_gid_ : nullptr; }
    void qp_gone(uint16_t lid, uint32_t qpn, uint16_t peer_lid, uint32_t peer_qpn) override {
        if (up()) link_->send_qp_gone(lid, qpn, peer_lid, peer_qpn);
    }
    // What the peer announced of its UD QP `qpn` (null: nothing), on the
    // connection that is up, else on the last one.
    const Link::UdOwner* ud_owner(uint32_t qpn) const {
        const auto& m = up() ? link_->ud_owners : ud_saved_;
        auto it = m.find(qpn);
        return it == m.end() ? nullptr : &it->second;
    }

    bool up() const { return link_ && link_->state() == LinkState::Up; }
    const std::string& address() const { return address_; }
    LinkStats totals() const;

private:
    friend class Fabric;
    std::string address_;
    sockaddr_in addr_;
    bool configured_;
    std::unique_ptr<Link> link_;
    InstanceId instance_{};
    uint16_t lid_first_ = 0, lid_last_ = 0;
    uint8_t device_gid_[16] = {};
    bool has_device_ = false;
    bool ever_up_ = false;
    bool dialing_ = false;        // a connection of ours is being opened or authenticated
    UniqueFd connecting_;         // non-blocking connect() in progress
    uint64_t next_dial_ns_ = 0;
    uint64_t backoff_ns_ = 0;
    std::string last_error_;
    bool refused_ = false;
    LinkStats past_;              // of closed links
    // The UD QPs the last connection announced: a QP on the device works
    // while the TCP connection is down.
    std::unordered_map<uint32_t, Link::UdOwner> ud_saved_;
};

class Fabric final : public UdDirectory {
public:
    explicit Fabric(Engine& eng);
    ~Fabric() override;

    void announce_ud(uint16_t lid, uint32_t qpn, uint64_t guid) override;
    bool ud_owner(const uint8_t* gid, uint32_t qpn, uint16_t& lid, uint64_t& guid) const override;

    // Loads the key, listens, and starts dialing the configured peers.
    bool start(const FabricConfig& cfg, std::string& error);
    bool enabled() const { return enabled_; }
    // An fd that is readable when any fabric socket needs attention (for
    // the daemon's epoll).
    int epoll_fd() const { return epoll_.get(); }
    // Handles ready sockets, dials, handshake timeouts. Never blocks.
    void poll();
    // Reads what the connected peers sent, one read per link and no
    // epoll_wait: the daemon's busy loop calls this every pass (poll()
    // handles the rest when the fabric's epoll fd reports it). True if
    // bytes came in.
    bool poll_links();
    // Writes what the requesters and responders queued. True if bytes went
    // out: what they finished may have completed WQEs (UD and UC sends
    // complete once written) and marked QPs for the engine's next pass, so
    // the caller must not go to sleep before that pass.
    bool flush();
    // Earliest dial or handshake deadline (0: none).
    uint64_t next_deadline_ns() const;
    // One line per peer (vrdmactl peers).
    std::string status() const;
    // What status() says of each peer, for the metrics.
    struct PeerInfo {
        std::string address;
        const char* state;  // up, refused, connecting or down
        uint16_t lid_first, lid_last;
        LinkStats totals;
    };
    std::vector<PeerInfo> peer_info() const;
    CryptoMode crypto() const { return cfg_.crypto; }
    // A guest added at run time (vrdmactl guest add): the peers that are up
    // learn its partitions now, later ones with their Hello.
    void announce_partitions(uint16_t lid, const std::vector<uint16_t>& pkeys);
    // Of every peer's connections together.
    LinkStats totals() const;
    const FabricCounters& counters() const { return counters_; }

private:
    struct Pending {
        std::unique_ptr<Link> link;
        Peer* dialer = nullptr;   // the peer this shim dialed, if it did
        uint64_t deadline_ns = 0;
        uint32_t source = 0;      // accepted: the remote IPv4 address (network order)
    };
    // Whether a connection from `ip` may start a handshake now.
    bool admit(uint32_t ip);
    void accept_all();
    void dial(Peer& p);
    void on_connected(Peer& p);
    void service();
    void establish(Pending& pending);
    void link_closed(Peer& p);
    // Every UD QP on this shim's device, to a peer that just came up.
    void announce_all_ud(Peer& p);
    void watch(Link& l, bool add);
    Peer* find_peer(const sockaddr_in& ip, const Hello& hello, Peer* dialer);
    std::string overlap(const Peer& p, uint16_t first, uint16_t last) const;

    Engine& eng_;
    bool enabled_ = false;
    FabricKey key_;
    TlsContext tls_;
    FabricConfig cfg_;
    InstanceId instance_{};
    FabricCounters counters_;
    uint64_t flood_logged_ns_ = 0;
    uint16_t listen_port_ = 0;
    UniqueFd listen_, epoll_;
    std::vector<std::unique_ptr<Peer>> peers_;
    std::vector<Pending> pending_;
};

}  // namespace vrdma::shim::fabric
