// The fabric: this shim and its peer shims, each owning a range of LIDs,
// joined by TLS 1.3 over TCP (docs/protocol.md "Fabric").
//
// Every worker of the shim runs a Fabric of its own, and a connection joins
// one worker of each shim: the dialer names the peer's worker it wants, and
// the worker that listens hands the link to that worker once the Hellos
// are through (FabricConfig::hand_off). Each Peer is one (peer shim, worker
// of it) and a Transport: the route table sends each guest of that worker
// to it as the link announces the guest (its partitions), and its link
// (link.h) carries the requests and responses of all QPs between the two
// workers. Dialing the peer's worker 0 tells how many workers it runs; the
// others are then dialed too. Configured peers (--fabric-peer) are
// dialed and redialed with backoff; any shim that completes the TLS
// handshake (it knows the fabric key) may connect. A peer whose LID range
// overlaps this shim's or another live peer's is refused with the reason,
// on both sides. Handshakes in progress are bounded per source address,
// with a slot always kept for the configured peers' addresses.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric_key.h"
#include "link.h"
#include "poll_group.h"
#include "tls_channel.h"
#include "transport.h"
#include "vrdma_common/ipv4_endpoint.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {
class Engine;
}

namespace vrdma::shim::fabric {

constexpr uint32_t kDefaultAckDelayUs = 10, kMaxAckDelayUs = 1000;

struct FabricConfig {
    std::string listen;              // ADDR:PORT, empty: accept nothing
    std::vector<std::string> peers;  // ADDR:PORT each
    std::string key_file;
    CryptoMode crypto = CryptoMode::Encrypt;
    // How long a plain ACK may wait for other output to carry it (Link::set_ack_delay).
    uint32_t ack_delay_us = kDefaultAckDelayUs;
    uint16_t lid_first = 0, lid_last = 0;
    // The shim's, the same in every worker's fabric (zero: a random one).
    InstanceId instance{};
    // This worker, of `workers`. Only the worker that `accepts` listens;
    // it gives the links meant for another worker to `hand_off`, which
    // must get them to that worker's adopt(), in its thread.
    uint32_t worker = 0, workers = 1;
    bool accepts = true;
    std::function<void(uint32_t worker, std::unique_ptr<Link>)> hand_off;
    // Worker 0 reached configured peer `address` (`addr`): its instance id
    // and worker count, for the other workers' learn(), in their threads.
    // Only worker 0 dials a configured peer before it knows them.
    std::function<void(const std::string& address, const sockaddr_in& addr, const InstanceId& instance,
                       uint8_t workers)>
        learned;
    // rdma_cm (src/shim/cm), in worker 0 only, on its links to each peer
    // shim's worker 0: a CM message that peer (LIDs peer_first..peer_last)
    // sent from its guest `src_lid`, and the peer coming up or going down
    // (a link replaced by a newer one is not down). Called in the worker's
    // thread.
    std::function<void(uint16_t peer_first, uint16_t peer_last, uint16_t src_lid, const uint8_t* msg, size_t len)>
        cm_received;
    std::function<void(uint16_t peer_first, uint16_t peer_last, bool up)> cm_peer;
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

// The status() of every worker's fabric, one after the other, as one: the
// peer lines as they are, one "no peers" at most, and one summary line
// whose counters are the sums of theirs.
std::string merge_status(const std::string& reports);

using vrdma::parse_endpoint;

class Peer final : public Transport {
public:
    Peer(std::string address, const sockaddr_in& addr, bool configured, uint8_t remote_worker = 0)
        : address_(std::move(address)), addr_(addr), configured_(configured), remote_worker_(remote_worker) {}
    const char* name() const override { return "tcp"; }
    bool keeps_memory() const override { return true; }
    SendResult send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local, uint32_t nlocal,
                    Pins* pins, Response& resp) override;
    bool delivering_since(uint64_t since_ns) const override;
    // Kept from the peer's last Hello: QPs bound to the device do not need
    // the TCP link, and new ones may bind while it is down.
    const uint8_t* device_gid() const override { return has_device_ ? device_gid_ : nullptr; }
    // The wire carries no event: the peer raises QP_FATAL.
    void qp_gone(uint16_t lid, uint32_t qpn, uint16_t peer_lid, uint32_t peer_qpn, int) override {
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
    uint8_t remote_worker_;       // the worker of the peer shim at the other end
    uint8_t remote_workers_ = 1;  // how many it runs (its last Hello)
    std::unique_ptr<Link> link_;
    InstanceId instance_{};
    uint16_t lid_first_ = 0, lid_last_ = 0;
    uint8_t device_gid_[16] = {};
    bool has_device_ = false;
    bool ever_up_ = false;
    // instance_ is the peer's (from a Hello, here or on another worker's
    // link): of two shims that both dial, only the one with the smaller
    // instance id dials a pair of workers at once; the other waits until
    // defer_until_ns_ for its connection (and dials then if none came).
    bool instance_known_ = false;
    uint64_t defer_until_ns_ = 0;
    // Set while a connection accepted from this peer's address is in its
    // handshake: the dial waits for it until then, not longer (four stalled
    // handshakes from that host must not keep this shim from dialing).
    uint64_t handshake_wait_until_ns_ = 0;
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

class Fabric final : public UdDirectory, public MulticastForwarder, public PollGroup {
public:
    explicit Fabric(Engine& eng);
    ~Fabric() override;

    // To every peer worker whose link is up, once per (peer shim, worker)
    // even when two links join them; each copies it to its own members of
    // the group.
    void forward_multicast(Engine& eng, const Request& req, const uint8_t* payload) override;

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
    // A link another worker's fabric accepted for this worker (hand_off),
    // its Hellos through: it becomes a peer's link here as if accepted here.
    void adopt(std::unique_ptr<Link> link);
    // What worker 0 learned of a configured peer (FabricConfig::learned):
    // each of its workers becomes a configured peer here.
    void learn(const std::string& address, const sockaddr_in& addr, const InstanceId& instance, uint8_t workers);
    // Earliest dial or handshake deadline (0: none).
    uint64_t next_deadline_ns() const override;

    // As a poll group of its worker (poll_group.h): each pass writes and
    // reads the links, one read per link and no epoll_wait, then services
    // them; the epoll fd reports the rest (accepts, dials, handshakes). True
    // if bytes moved either way: the caller must not go to sleep before its
    // next pass (what was written may have completed WQEs).
    bool poll(Engine&) override;
    std::vector<int> fds() const override { return {epoll_fd()}; }
    void on_event(Engine&, size_t) override { poll(); }
    bool polls_with_syscalls() const override { return true; }
    // One line per peer (vrdmactl peers).
    std::string status() const;
    // What status() says of each peer, for the metrics.
    struct PeerInfo {
        std::string address;
        uint32_t worker, peer_worker;  // this shim's worker and the peer's, at the two ends
        const char* state;  // up, refused, connecting or down
        uint16_t lid_first, lid_last;
        LinkStats totals;
    };
    std::vector<PeerInfo> peer_info() const;
    CryptoMode crypto() const { return cfg_.crypto; }
    // A guest added at run time (vrdmactl guest add): the peers that are up
    // learn its partitions now, later ones with their Hello.
    void announce_partitions(uint16_t lid, const std::vector<uint16_t>& pkeys);
    // A CM message from this shim's guest `src_lid` to the peer shim whose
    // LIDs start at `peer_first` (worker 0: on the link to that peer's
    // worker 0). False: that peer is not up, or the guest's queue is full.
    bool send_cm(uint16_t peer_first, uint16_t src_lid, const uint8_t* msg, size_t len);
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
    // Whether a connection accepted from `ip` is in its handshake.
    bool handshake_from(uint32_t ip) const;
    void accept_all();
    void dial(Peer& p);
    void on_connected(Peer& p);
    // Once a pass (poll(Engine&)), after each epoll event (poll()), and when
    // a link is adopted or a peer learned: links watched for what they have
    // to write, finished or failed handshakes, closed connections, dials
    // that are due.
    void service();
    // Reads what the connected peers sent, one read per link and no
    // epoll_wait (poll() handles the rest when the fabric's epoll fd reports
    // it). True if bytes came in.
    [[gnu::noinline]] bool read_links();  // noinline: scripts/bench-instructions.sh counts it by name
    // Writes what the requesters and responders queued. True if bytes went
    // out: what they finished may have completed WQEs (UD and UC sends
    // complete once written) and marked QPs for the engine's next pass, so
    // the caller must not go to sleep before that pass.
    bool write_links();
    void establish(Pending& pending);
    // Whether `pd` (accepted, its Hellos through) belongs to this worker;
    // if not it is handed off or refused.
    bool mine(Pending& pd);
    // Configured peer `address` runs `workers` workers (from worker `from`
    // of them on): each is a configured peer (dialed in turn), none beyond.
    void configure_workers(const std::string& address, const sockaddr_in& addr, const InstanceId& instance,
                           uint8_t workers, uint8_t from);
    LinkIdentity identity(uint8_t target) const;
    void link_closed(Peer& p);
    // Every UD QP on this shim's device, to a peer that just came up.
    void announce_all_ud(Peer& p);
    void watch(Link& l, bool add);
    Peer* find_peer(const sockaddr_in& ip, const Hello& hello, Peer* dialer);
    std::string overlap(const Peer& p, const Hello& hello) const;

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
