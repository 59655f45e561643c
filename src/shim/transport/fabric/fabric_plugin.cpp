#include "fabric_plugin.h"

#include <atomic>

#include "engine.h"
#include "fabric.h"

namespace vrdma::shim::fabric {
namespace {

constexpr const char* kListen = "--fabric-listen";
constexpr const char* kPeer = "--fabric-peer";
constexpr const char* kKey = "--fabric-key";
constexpr const char* kCrypto = "--fabric-crypto";
constexpr const char* kAckDelay = "--fabric-ack-delay";

const std::string* last(const TransportArgs& args, const char* name) {
    auto it = args.find(name);
    return it == args.end() || it->second.empty() ? nullptr : &it->second.back();
}

bool wanted(const TransportArgs& args) { return last(args, kListen) || last(args, kPeer); }

// --fabric-ack-delay's microseconds: digits only, at most kMaxAckDelayUs.
bool parse_ack_delay(const std::string& text, uint32_t& out) {
    if (text.empty() || text.size() > 4 || text.find_first_not_of("0123456789") != std::string::npos) return false;
    const unsigned long v = std::stoul(text);
    if (v > kMaxAckDelayUs) return false;
    out = uint32_t(v);
    return true;
}

bool check(const TransportArgs& args, std::string& error) {
    if (const std::string* c = last(args, kCrypto)) {
        CryptoMode unused;
        if (!parse_crypto_mode(*c, unused)) {
            error = "--fabric-crypto must be encrypt or integrity, not '" + *c + "'";
            return false;
        }
    }
    if (const std::string* d = last(args, kAckDelay)) {
        uint32_t unused;
        if (!parse_ack_delay(*d, unused)) {
            error = "--fabric-ack-delay must be microseconds from 0 to " + std::to_string(kMaxAckDelayUs) + ", not '" +
                    *d + "'";
            return false;
        }
    }
    const bool key = last(args, kKey) != nullptr;
    if (wanted(args) && !key) {
        error = "--fabric-listen and --fabric-peer need --fabric-key FILE (the fabric's shared secret)";
        return false;
    }
    if (!wanted(args) && key) {
        error = "--fabric-key without --fabric-listen or --fabric-peer";
        return false;
    }
    return true;
}

class FabricPlugin final : public TransportPlugin {
public:
    explicit FabricPlugin(const TransportArgs& args) {
        if (const std::string* l = last(args, kListen)) cfg_.listen = *l;
        if (auto it = args.find(kPeer); it != args.end()) cfg_.peers = it->second;
        cfg_.key_file = *last(args, kKey);  // check() made sure
        if (const std::string* c = last(args, kCrypto)) parse_crypto_mode(*c, cfg_.crypto);
        if (const std::string* d = last(args, kAckDelay)) parse_ack_delay(*d, cfg_.ack_delay_us);
    }

    const char* name() const override { return "fabric"; }

    bool open(const ShimFacts& shim, std::string&) override {
        shim_ = shim;
        for (WorkerPort* w : shim.workers) fabrics_.push_back(std::make_unique<Fabric>(w->engine()));
        return true;
    }

    bool start(const ShimFacts& shim, std::string& error) override {
        FabricConfig fc = cfg_;
        fc.lid_first = shim.lid_first;
        fc.lid_last = shim.lid_last;
        random_bytes(fc.instance.data(), fc.instance.size());
        fc.workers = uint32_t(shim.workers.size());
        // Worker 0 listens; a link it accepted for another worker goes to
        // that worker's thread, which adopts it.
        fc.hand_off = [this](uint32_t w, std::unique_ptr<Link> link) {
            auto held = std::make_shared<std::unique_ptr<Link>>(std::move(link));
            Fabric* to = fabrics_[w].get();
            shim_.workers[w]->post([to, held] { to->adopt(std::move(*held)); });
        };
        // Worker 0 reached a configured peer: the others dial its workers.
        fc.learned = [this](const std::string& address, const sockaddr_in& addr, const InstanceId& id,
                            uint8_t peer_workers) {
            for (size_t w = 1; w < fabrics_.size(); ++w) {
                Fabric* to = fabrics_[w].get();
                shim_.workers[w]->post([to, address, addr, id, peer_workers] {
                    to->learn(address, addr, id, peer_workers);
                });
            }
        };
        fc.cm_received = cm_.received;
        fc.cm_peer = cm_.peer;
        // Polled first: a peer's announcement of a UD QP on its device,
        // sent before that QP's first datagram, is read before the device
        // delivers the datagram.
        for (uint32_t w = 0; w < fabrics_.size(); ++w) {
            fc.worker = w;
            fc.accepts = w == 0;
            if (!fabrics_[w]->start(fc, error) || !shim.workers[w]->add_poll_group(*fabrics_[w], true, error))
                return false;
        }
        ready_ = " fabric lids " + std::to_string(fc.lid_first) + "-" + std::to_string(fc.lid_last);
        return true;
    }

    void close() override { fabrics_.clear(); }

    std::string ready_words() const override { return ready_; }

    void guest_added(WorkerPort& w, const GuestIdentity& g) override {
        if (w.index() < fabrics_.size() && fabrics_[w.index()]->enabled())
            fabrics_[w.index()]->announce_partitions(g.lid, g.pkeys);  // the peers that are up
    }

    std::string counters(const AskWorkers& ask) override {
        // Read in each worker's thread; ask answers one worker at a time,
        // and a late answer writes into this copy, not into freed memory.
        auto sum = std::make_shared<std::atomic<uint64_t>>(0);
        ask([this, sum](WorkerPort& w, std::string&) {
            const LinkStats t = fabrics_[w.index()]->totals();
            *sum += t.tx_payload + t.rx_payload;
        });
        return "tcp copied_bytes " + std::to_string(sum->load()) + "\n";
    }

    std::string peers(const AskWorkers& ask) override {
        // Each worker's links, then the refusals of all of them together.
        return merge_status(ask([this](WorkerPort& w, std::string& text) { text = fabrics_[w.index()]->status(); }));
    }

    void metric_samples(WorkerPort& w, std::string& out) override;
    std::vector<MetricFamily> metric_families() const override;

    bool reaches_peer_shims() const override { return true; }
    size_t cm_capacity() const override { return kMaxCmPayload; }
    void set_cm_hooks(CmCarrierHooks hooks) override { cm_ = std::move(hooks); }
    bool send_cm(uint16_t peer_first, uint16_t src_lid, const uint8_t* msg, size_t len) override {
        return !fabrics_.empty() && fabrics_[0]->send_cm(peer_first, src_lid, msg, len);
    }

private:
    FabricConfig cfg_;
    ShimFacts shim_;
    std::vector<std::unique_ptr<Fabric>> fabrics_;  // by worker
    CmCarrierHooks cm_;
    std::string ready_;
};

void FabricPlugin::metric_samples(WorkerPort& w, std::string& out) {
    const Fabric& fab = *fabrics_[w.index()];
    const std::string wl = "worker=\"" + std::to_string(w.index()) + "\"";
    for (const auto& p : fab.peer_info()) {
        // One link per worker of each side.
        const std::string pl = "peer=\"" + label_value(p.address) + "\"," + wl + ",peer_worker=\"" +
                               std::to_string(p.peer_worker) + "\"";
        const LinkStats& t = p.totals;
        add_sample(out, "vrdma_fabric_peer_up", pl, uint64_t(std::string(p.state) == "up"));
        add_sample(out, "vrdma_fabric_peer_tx_bytes_total", pl, t.tx_bytes);
        add_sample(out, "vrdma_fabric_peer_rx_bytes_total", pl, t.rx_bytes);
        add_sample(out, "vrdma_fabric_peer_tx_messages_total", pl, t.tx_msgs);
        add_sample(out, "vrdma_fabric_peer_rx_messages_total", pl, t.rx_msgs);
        add_sample(out, "vrdma_fabric_peer_retries_total", pl, t.retries);
        add_sample(out, "vrdma_fabric_peer_errors_total", pl, t.errors);
        add_sample(out, "vrdma_fabric_peer_foreign_lid_total", pl, t.foreign_lid);
        add_sample(out, "vrdma_fabric_peer_foreign_pkey_total", pl, t.foreign_pkey);
    }
    const FabricCounters& c = fab.counters();
    const std::pair<const char*, uint64_t> reasons[] = {
        {"handshake_failed", c.handshake_failed}, {"handshake_timeout", c.handshake_timeout},
        {"mode_mismatch", c.mode_mismatch},       {"tampered", c.tampered},
        {"flood_refused", c.flood_refused},       {"replace_refused", c.replace_refused}};
    for (const auto& [reason, n] : reasons)
        add_sample(out, "vrdma_fabric_refusals_total", std::string("reason=\"") + reason + "\"," + wl, n);
}

std::vector<MetricFamily> FabricPlugin::metric_families() const {
    return {
        {"vrdma_fabric_peer_up", "gauge", "1 while the link to the peer shim is up and authenticated."},
        {"vrdma_fabric_peer_tx_bytes_total", "counter", "Bytes sent to the peer shim (its connections together)."},
        {"vrdma_fabric_peer_rx_bytes_total", "counter", "Bytes received from the peer shim."},
        {"vrdma_fabric_peer_tx_messages_total", "counter", "Messages sent to the peer shim."},
        {"vrdma_fabric_peer_rx_messages_total", "counter", "Messages received from the peer shim."},
        {"vrdma_fabric_peer_retries_total", "counter", "Requests sent to the peer again (RNR, timeouts)."},
        {"vrdma_fabric_peer_errors_total", "counter", "Malformed or misrouted input from the peer, NAKs sent."},
        {"vrdma_fabric_peer_foreign_lid_total", "counter", "Requests from the peer for LIDs it does not own, dropped."},
        {"vrdma_fabric_peer_foreign_pkey_total", "counter",
         "Requests from the peer with a P_Key its guest is not a member of, dropped."},
        {"vrdma_fabric_refusals_total", "counter", "Connections refused or closed by the fabric, by reason (handshake failed or timed out, "
         "crypto mode mismatch, tampered data, handshake flood, live link kept)."},
    };
}

std::unique_ptr<TransportPlugin> make(const TransportArgs& args) {
    if (!wanted(args)) return nullptr;
    return std::make_unique<FabricPlugin>(args);
}

}  // namespace

const TransportFactory& factory() {
    static const TransportFactory f{
        "fabric",
        {
            {kListen, "ADDR:PORT", false, R"(        Accept connections from peer shims on this IPv4 address and TCP
        port (0.0.0.0 for every address).
)"},
            {kPeer, "ADDR:PORT", true, R"(        A peer shim to connect to (its --fabric-listen address); repeat for
        more. Peers may be named on either side or on both; an unreachable
        peer is retried with backoff and reported (vrdmactl peers). Any shim
        that completes the TLS handshake (it knows the key) may connect,
        named or not; a new connection never replaces a live, talking link
        to the same peer. Handshakes in progress are limited to 4 per source
        address and 2 s each; a named peer's address always gets a slot.
)"},
            {kKey, "FILE", false, R"(        The fabric's shared secret: the file's bytes (a trailing newline is
        ignored), at least 16, the same file on every host (for example
        head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE). Shims
        speak TLS 1.3 to each other with a pre-shared key derived from it
        (HKDF-SHA256) and an ephemeral Diffie-Hellman exchange (forward
        secrecy); the dialer is the client, the listener the server, no
        certificates. The key itself is never sent. A peer without it, or a
        relay between two shims, cannot complete the handshake: refused,
        logged and counted (vrdmactl peers). Required with --fabric-listen
        or --fabric-peer.
)"},
            {kCrypto, "encrypt|integrity", false, R"(        What protects the bytes between shims after the handshake; both
        ends must use the same mode (a mismatch is refused and logged on
        both sides). Both modes send frames of up to 64 KiB keyed from the
        TLS session (its exporter; new keys every 2^20 frames) with
        sequence-number nonces. encrypt (the default): AES-128-GCM
        ciphertext: confidentiality, integrity and replay protection of
        everything, payloads, QPNs, PSNs and keys included. integrity:
        AES-128-GCM tags over cleartext: integrity and replay protection
        only; payloads and headers are readable on the wire, for less
        CPU. In both modes a changed byte closes the link and is
        counted (vrdmactl peers: tampered), and nothing unauthenticated
        reaches a guest.
)"},
            {kAckDelay, "USEC", false, R"(        How long the acknowledgement of a SEND or WRITE may wait for other
        traffic to the same peer shim to carry it (default 10, 0 to 1000;
        0: acknowledge at once). An answer going back, as in a ping-pong,
        then costs one write and one read less on each side; an ACK with
        nothing to ride on leaves when the time is up or when it covers 16
        messages, so a requester's send completions come at most that much
        later.
)"},
        },
        check,
        make,
    };
    return f;
}

}  // namespace vrdma::shim::fabric
