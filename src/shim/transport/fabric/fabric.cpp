#include "fabric.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "context.h"
#include "engine.h"
#include "vrdma_common/log.h"

namespace vrdma::shim::fabric {
namespace {

// A handshake (TLS and the Hellos) takes a few round trips: one that is not
// done in 2 s holds its slot no longer.
constexpr uint64_t kHandshakeTimeoutNs = 2'000'000'000;
// Handshakes in progress: per source address, and from sources that are
// not configured peers all together (a configured peer's address is never
// refused for others' handshakes).
constexpr size_t kPendingPerSource = 4;
constexpr size_t kPendingStrangers = 60;
// A live link that heard nothing for this long may be replaced by a new
// connection of the same peer (its host restarted without a reset).
constexpr uint64_t kReplaceSilentNs = 3'000'000'000;
constexpr uint64_t kDialBackoffMinNs = 100'000'000;
constexpr uint64_t kDialBackoffMaxNs = 2'000'000'000;
constexpr uint64_t kTagPeer = 1, kTagListen = 2;
constexpr uint64_t kRefusedRedialNs = 5'000'000'000;
constexpr const char* kReplaced = "replaced by a duplicate connection";
// A shim whose instance id is the larger waits this long for the peer's
// connection to a pair of workers before it dials the pair itself.
constexpr uint64_t kDeferNs = 1'000'000'000;
// How long a dial waits for the peer's connection in its handshake.
constexpr uint64_t kHandshakeWaitNs = 1'000'000'000;

std::string ip_text(const sockaddr_in& a) {
    char buf[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
    return buf;
}

std::string endpoint_text(const sockaddr_in& a) { return ip_text(a) + ":" + std::to_string(ntohs(a.sin_port)); }

void tune_socket(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // A dead peer host (no FIN, no RST) is noticed within about 20 s even
    // when idle; the QPs' own timers notice much sooner.
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    int idle = 10, intvl = 2, cnt = 5;
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

}  // namespace

std::string merge_status(const std::string& reports) {
    std::string peers, summary;
    std::vector<std::string> words;   // of the first summary line
    std::vector<uint64_t> sums;
    std::istringstream in(reports);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("fabric ", 0) != 0) {
            if (line != "no peers") peers += line + "\n";
            continue;
        }
        std::istringstream ws(line);
        std::vector<std::string> w;
        for (std::string x; ws >> x;) w.push_back(x);
        if (words.empty()) {
            words = w;
            sums.assign(w.size(), 0);
        }
        // "fabric crypto MODE key n key n ...": the same keys in every line.
        for (size_t i = 4; i < w.size() && i < words.size(); i += 2) sums[i] += std::strtoull(w[i].c_str(), nullptr, 10);
    }
    if (words.empty()) return reports;
    if (peers.empty()) peers = "no peers\n";
    for (size_t i = 0; i < words.size(); ++i) {
        summary += i ? " " : "";
        summary += i >= 4 && i % 2 == 0 ? std::to_string(sums[i]) : words[i];
    }
    return peers + summary + "\n";
}

SendResult Peer::send(Engine&, Context& ctx, Qp&, const Request& req, const Span* local, uint32_t nlocal, Pins* pins,
                      Response& resp) {
    if (!up()) {  // the peer cannot be reached: the request is lost
        resp = Response{};
        resp.syndrome = Syndrome::Drop;
        resp.psn = req.psn;
        return SendResult::Done;
    }
    if (!link_->send_request(req, ctx.id(), local, nlocal, req.inline_payload, pins)) return SendResult::Busy;
    return SendResult::InFlight;
}

// Over TCP a lost segment stalls the stream for a retransmission timeout
// (200 ms at least, doubling while losses repeat), and every refusal is
// answered: a peer that is connected and was heard from within the last
// kSilentNs (or since the request left) is taken to be delivering, late,
// and the QP's timer does not count against retry_cnt; for at most
// kLateNs in all. A peer that vanished without a reset (its host gone) is
// thus reported kSilentNs later than its QPs' timeouts alone would say; a
// killed shim resets the connection and is reported at once.
bool Peer::delivering_since(uint64_t since_ns) const {
    constexpr uint64_t kSilentNs = 3'000'000'000, kLateNs = 30'000'000'000;
    if (!up()) return false;
    const uint64_t now = monotonic_ns();
    const uint64_t heard = std::max(link_->last_rx_ns(), since_ns);
    return now - since_ns < kLateNs && now - heard < kSilentNs;
}

LinkStats Peer::totals() const {
    LinkStats t = past_;
    if (link_) {
        t.tx_bytes += link_->stats.tx_bytes;
        t.rx_bytes += link_->stats.rx_bytes;
        t.tx_payload += link_->stats.tx_payload;
        t.rx_payload += link_->stats.rx_payload;
        t.tx_msgs += link_->stats.tx_msgs;
        t.rx_msgs += link_->stats.rx_msgs;
        t.retries += link_->stats.retries;
        t.errors += link_->stats.errors;
        t.foreign_lid += link_->stats.foreign_lid;
        t.foreign_pkey += link_->stats.foreign_pkey;
    }
    return t;
}

Fabric::Fabric(Engine& eng) : eng_(eng) {}

Fabric::~Fabric() {
    if (eng_.ud_directory() == this) eng_.set_ud_directory(nullptr);
    if (eng_.multicast_forwarder() == this) eng_.set_multicast_forwarder(nullptr);
    for (auto& p : peers_) eng_.routes().remove(p.get());
}

void Fabric::announce_ud(uint16_t lid, uint32_t qpn, uint64_t guid) {
    for (auto& p : peers_)
        if (p->up() && p->has_device_) p->link_->send_ud_qp(lid, qpn, guid);
}

void Fabric::forward_multicast(Engine& eng, const Request& req, const uint8_t* payload) {
    for (size_t i = 0; i < peers_.size(); ++i) {
        const Peer& p = *peers_[i];
        if (!p.up()) continue;
        bool seen = false;  // a second link to the same worker of the same shim
        for (size_t j = 0; j < i && !seen; ++j)
            seen = peers_[j]->up() && peers_[j]->instance_ == p.instance_ && peers_[j]->remote_worker_ == p.remote_worker_;
        if (seen) continue;
        p.link_->send_multicast(req, payload);
        eng.turns().charge(TurnScheduler::kWqeCost + req.length);
    }
}

bool Fabric::ud_owner(const uint8_t* gid, uint32_t qpn, uint16_t& lid, uint64_t& guid) const {
    for (auto& p : peers_) {
        if (!p->has_device_ || std::memcmp(p->device_gid_, gid, 16) != 0) continue;
        if (const Link::UdOwner* o = p->ud_owner(qpn)) {
            lid = o->lid;
            guid = o->guid;
            return true;
        }
    }
    return false;
}

void Fabric::announce_all_ud(Peer& p) {
    if (!p.has_device_) return;
    eng_.for_each_context([&](Context& ctx) {
        ctx.qps.for_each([&](uint32_t, Qp& qp) {
            if (qp.type == IBV_QPT_UD && qp.carried)
                p.link_->send_ud_qp(ctx.guest().lid, qp.qpn, ctx.guest().guid);
        });
    });
}

bool Fabric::start(const FabricConfig& cfg, std::string& error) {
    cfg_ = cfg;
    eng_.set_ud_directory(this);
    eng_.set_multicast_forwarder(this);
    if (!key_.load(cfg.key_file, error)) return false;
    if (!tls_.init(key_, cfg.crypto, error)) return false;
    instance_ = cfg.instance;
    if (instance_ == InstanceId{}) random_bytes(instance_.data(), instance_.size());
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_) {
        error = std::string("epoll: ") + strerror(errno);
        return false;
    }
    // Every worker says the port in its Hellos; only the one that accepts
    // listens on it.
    sockaddr_in listen_addr{};
    if (!cfg.listen.empty()) {
        if (!parse_endpoint(cfg.listen, listen_addr, error)) {
            error = "--fabric-listen: " + error;
            return false;
        }
        listen_port_ = ntohs(listen_addr.sin_port);
    }
    if (!cfg.listen.empty() && cfg.accepts) {
        listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        int one = 1;
        ::setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (!listen_ || ::bind(listen_.get(), reinterpret_cast<sockaddr*>(&listen_addr), sizeof(listen_addr)) != 0 ||
            ::listen(listen_.get(), 64) != 0) {
            error = "cannot listen on " + cfg.listen + " (--fabric-listen): " + strerror(errno);
            return false;
        }
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kTagListen;
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listen_.get(), &ev);
    }
    for (const std::string& text : cfg.peers) {
        sockaddr_in a;
        if (!parse_endpoint(text, a, error)) {
            error = "--fabric-peer: " + error;
            return false;
        }
        // The other workers dial once worker 0 learned the peer (learn()).
        if (cfg.worker == 0) peers_.push_back(std::make_unique<Peer>(endpoint_text(a), a, true));
    }
    enabled_ = true;
    if (cfg.worker != 0) return true;  // said once, by worker 0
    LOG_INFO("fabric: this shim owns lids %u-%u; listening on %s; %zu configured peer(s); TLS 1.3 (PSK), "
             "--fabric-crypto %s; %u worker(s), a connection per worker of each side",
             cfg.lid_first, cfg.lid_last, cfg.listen.empty() ? "nothing" : cfg.listen.c_str(), peers_.size(),
             crypto_mode_name(cfg.crypto), cfg.workers);
    return true;
}

void Fabric::watch(Link& l, bool add) {
    epoll_event ev{};
    ev.events = EPOLLIN | (l.wants_write() ? uint32_t(EPOLLOUT) : 0u);
    if (!add && ev.events == l.watched_events) return;
    ev.data.u64 = reinterpret_cast<uint64_t>(&l);
    if (::epoll_ctl(epoll_.get(), add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, l.fd(), &ev) == 0) l.watched_events = ev.events;
}

void Fabric::dial(Peer& p) {
    p.connecting_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!p.connecting_) return;
    tune_socket(p.connecting_.get());
    int rc = ::connect(p.connecting_.get(), reinterpret_cast<const sockaddr*>(&p.addr_), sizeof(p.addr_));
    if (rc != 0 && errno != EINPROGRESS) {
        p.last_error_ = strerror(errno);
        p.connecting_.reset();
        return;
    }
    p.dialing_ = true;
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u64 = reinterpret_cast<uint64_t>(&p) | kTagPeer;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, p.connecting_.get(), &ev);
}

void Fabric::on_connected(Peer& p) {
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(p.connecting_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, p.connecting_.get(), nullptr);
    if (err) {
        if (p.last_error_ != strerror(err))
            LOG_WARN("fabric: peer %s unreachable: %s; retrying", p.address_.c_str(), strerror(err));
        p.last_error_ = strerror(err);
        p.connecting_.reset();
        p.dialing_ = false;
        return;
    }
    Pending pd;
    pd.link = std::make_unique<Link>(eng_, tls_, std::move(p.connecting_), true, identity(p.remote_worker_),
                                     p.address_);
    pd.dialer = &p;
    pd.deadline_ns = monotonic_ns() + kHandshakeTimeoutNs;
    watch(*pd.link, true);
    pd.link->flush();
    pending_.push_back(std::move(pd));
}

void Fabric::accept_all() {
    // Bounded: under a flood of connections the worker goes on with its
    // other work (the listening socket stays readable for the next round).
    for (int round = 0; round < 64; ++round) {
        sockaddr_in from{};
        socklen_t len = sizeof(from);
        int fd = ::accept4(listen_.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (!admit(from.sin_addr.s_addr)) {
            ++counters_.flood_refused;
            const uint64_t now = monotonic_ns();
            if (now - flood_logged_ns_ > 1'000'000'000) {  // one line a second at most
                flood_logged_ns_ = now;
                LOG_WARN("fabric: connection from %s refused: too many handshakes pending from it (%llu refused so "
                         "far)",
                         endpoint_text(from).c_str(), (unsigned long long)counters_.flood_refused);
            }
            ::close(fd);
            continue;
        }
        tune_socket(fd);
        Pending pd;
        pd.link = std::make_unique<Link>(eng_, tls_, UniqueFd(fd), false, identity(kAnyWorker), endpoint_text(from));
            pd.deadline_ns = monotonic_ns() + kHandshakeTimeoutNs;
        pd.source = from.sin_addr.s_addr;
        watch(*pd.link, true);
        pd.link->flush();
        pending_.push_back(std::move(pd));
    }
}

bool Fabric::admit(uint32_t ip) {
    size_t same = 0, strangers = 0;
    bool configured = false;
    for (auto& p : peers_) configured |= p->configured_ && p->addr_.sin_addr.s_addr == ip;
    for (auto& pd : pending_) {
        if (pd.dialer) continue;
        same += pd.source == ip;
        bool known = false;
        for (auto& p : peers_) known |= p->configured_ && p->addr_.sin_addr.s_addr == pd.source;
        strangers += !known;
    }
    return same < kPendingPerSource && (configured || strangers < kPendingStrangers);
}

void Fabric::poll() {
    if (!enabled_) return;
    epoll_event evs[64];
    int n = ::epoll_wait(epoll_.get(), evs, 64, 0);
    for (int i = 0; i < n; ++i) {
        uint64_t tag = evs[i].data.u64;
        if (tag == kTagListen) {
            accept_all();
        } else if (tag & kTagPeer) {
            on_connected(*reinterpret_cast<Peer*>(tag & ~kTagPeer));
        } else {
            // A link may have been destroyed by an earlier event of this
            // batch (a duplicate closed): only known links are touched.
            auto* l = reinterpret_cast<Link*>(tag);
            bool known = false;
            for (auto& p : pending_) known |= p.link.get() == l;
            for (auto& p : peers_) known |= p->link_.get() == l;
            if (!known || l->state() == LinkState::Closed) continue;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) l->on_readable();
            if (l->state() != LinkState::Closed && (evs[i].events & EPOLLOUT)) l->flush();
        }
        service();
    }
    service();
}

bool Fabric::read_links() {
    uint64_t moved = 0;
    for (auto& p : peers_)
        if (p->link_ && p->link_->state() == LinkState::Up) {
            const uint64_t before = p->link_->stats.rx_bytes;
            p->link_->on_readable();
            if (p->link_) moved += p->link_->stats.rx_bytes - before;
        }
    return moved != 0;
}

bool Fabric::poll(Engine&) {
    bool moved = write_links();  // both, whatever the first did
    moved |= read_links();
    // Once a pass, after both: what the reads queued is watched for, and
    // the links' lives move on.
    service();
    return moved;
}

bool Fabric::write_links() {
    uint64_t moved = 0, now = 0;
    for (auto& p : peers_) {
        if (!p->link_ || p->link_->state() != LinkState::Up) continue;
        if (p->link_->ack_due_ns()) {
            if (!now) now = monotonic_ns();
            p->link_->release_due_acks(now);
        }
        if (p->link_->wants_write()) {
            const uint64_t before = p->link_->stats.tx_bytes;
            p->link_->flush();
            moved += p->link_->stats.tx_bytes - before;
        }
    }
    return moved != 0;
}

// Moves links through their life: handshakes that finished or failed,
// connections that closed, dials that are due.
void Fabric::service() {
    // The clock only where something waits on it: with every peer up and no
    // handshake under way (the steady state), a pass reads none here.
    uint64_t now_ns = 0;
    auto now = [&] { return now_ns ? now_ns : (now_ns = monotonic_ns()); };
    for (size_t i = 0; i < pending_.size();) {
        Pending& pd = pending_[i];
        Link& l = *pd.link;
        if (l.state() == LinkState::Handshake && now() > pd.deadline_ns) {
            ++counters_.handshake_timeout;
            l.close("handshake timed out");
        }
        if (l.state() == LinkState::Closed) {
            if (l.auth_failed()) ++counters_.handshake_failed;
            if (l.mode_mismatch()) ++counters_.mode_mismatch;
            if (l.tampered()) ++counters_.tampered;
            if (l.auth_failed())
                LOG_WARN("fabric: connection %s %s refused: authentication failed (it does not know the fabric key, "
                         "or its bytes were changed or replayed): %s",
                         pd.dialer ? "to" : "from", l.remote().c_str(), l.close_reason().c_str());
            else if (l.close_reason() == "the peer closed the connection")
                LOG_WARN("fabric: connection %s %s refused: the peer closed it during the handshake (does it use "
                         "another fabric key?)",
                         pd.dialer ? "to" : "from", l.remote().c_str());
            else
                LOG_WARN("fabric: connection %s %s closed during the handshake: %s", pd.dialer ? "to" : "from",
                         l.remote().c_str(), l.close_reason().c_str());
            if (pd.dialer) {
                pd.dialer->dialing_ = false;
                pd.dialer->last_error_ = l.close_reason();
                pd.dialer->refused_ = l.auth_failed() || l.close_reason().rfind("refused", 0) == 0;
                if (pd.dialer->refused_) pd.dialer->next_dial_ns_ = now() + kRefusedRedialNs;
            }
            pending_.erase(pending_.begin() + long(i));
            continue;
        }
        if (l.take_became_up()) {
            if (!pd.dialer && !mine(pd)) {
                if (pd.link) ++i;  // refused: kept until the reason is written
                else pending_.erase(pending_.begin() + long(i));
                continue;
            }
            Pending moved = std::move(pd);
            pending_.erase(pending_.begin() + long(i));
            establish(moved);
            continue;
        }
        if (l.wants_write()) watch(l, false);
        ++i;
    }
    for (auto& up : peers_) {
        Peer& p = *up;
        if (p.link_ && p.link_->state() == LinkState::Closed) link_closed(p);
        if (p.link_) watch(*p.link_, false);
        if (p.configured_ && !p.up() && !p.dialing_ && !p.connecting_ && now() >= p.next_dial_ns_) {
            // The peer is dialing this shim: its connection is in its
            // handshake. Wait for it (a while). Both dialing at once opens
            // two connections, and the one closed as the duplicate may
            // already carry messages or look, to the side that has not seen
            // the other one yet, like the peer going down.
            if (handshake_from(p.addr_.sin_addr.s_addr)) {
                if (!p.handshake_wait_until_ns_) p.handshake_wait_until_ns_ = now() + kHandshakeWaitNs;
                if (now() < p.handshake_wait_until_ns_) continue;
            }
            p.handshake_wait_until_ns_ = 0;
            // The peer dials this pair itself: give it the time to.
            if (p.instance_known_ && instance_ > p.instance_) {
                if (!p.defer_until_ns_) p.defer_until_ns_ = now() + kDeferNs;
                if (now() < p.defer_until_ns_) continue;
            }
            p.backoff_ns_ = p.backoff_ns_ ? std::min(p.backoff_ns_ * 2, kDialBackoffMaxNs) : kDialBackoffMinNs;
            p.next_dial_ns_ = now() + p.backoff_ns_;
            dial(p);
        }
    }
}

LinkIdentity Fabric::identity(uint8_t target) const {
    LinkIdentity me;
    me.instance = instance_;
    me.lid_first = cfg_.lid_first;
    me.lid_last = cfg_.lid_last;
    me.listen_port = listen_port_;
    me.workers = uint8_t(cfg_.workers);
    me.worker = target == kAnyWorker ? kAnyWorker : uint8_t(cfg_.worker);
    me.target = target;
    me.hold = true;
    me.ack_delay_ns = uint64_t(cfg_.ack_delay_us) * 1000;
    return me;
}

bool Fabric::handshake_from(uint32_t ip) const {
    for (const Pending& pd : pending_)
        if (!pd.dialer && pd.source == ip && pd.link && pd.link->state() != LinkState::Closed) return true;
    return false;
}

bool Fabric::mine(Pending& pd) {
    Link& l = *pd.link;
    const Hello& h = l.peer_hello();
    std::string why;
    if (h.worker == kAnyWorker || h.target == kAnyWorker)
        why = "refused: a dialing shim must name its worker and the one it wants";
    else if (h.target >= cfg_.workers)
        why = "refused: this shim runs " + std::to_string(cfg_.workers) + " worker(s), there is no worker " +
              std::to_string(h.target);
    if (!why.empty()) {
        LOG_WARN("fabric: connection from %s %s", l.remote().c_str(), why.c_str());
        l.refuse(why);
        l.flush();
        return false;
    }
    if (h.target == cfg_.worker) return true;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, l.fd(), nullptr);
    l.watched_events = 0;
    cfg_.hand_off(h.target, std::move(pd.link));
    return false;
}

void Fabric::adopt(std::unique_ptr<Link> link) {
    Pending pd;
    pd.link = std::move(link);
    pd.deadline_ns = monotonic_ns() + kHandshakeTimeoutNs;
    if (pd.link->state() == LinkState::Closed) return;
    watch(*pd.link, true);
    establish(pd);
    service();
}

void Fabric::learn(const std::string& address, const sockaddr_in& addr, const InstanceId& instance, uint8_t workers) {
    configure_workers(address, addr, instance, workers, 0);
    service();
}

void Fabric::configure_workers(const std::string& address, const sockaddr_in& addr, const InstanceId& instance,
                               uint8_t workers, uint8_t from) {
    auto same = [&](const Peer& p) {
        return p.addr_.sin_addr.s_addr == addr.sin_addr.s_addr && p.addr_.sin_port == addr.sin_port;
    };
    for (uint8_t k = from; k < workers; ++k) {
        Peer* found = nullptr;
        for (auto& p : peers_)
            if (p->remote_worker_ == k && same(*p)) found = p.get();
        if (!found) {
            peers_.push_back(std::make_unique<Peer>(address, addr, true, k));
            found = peers_.back().get();
        }
        found->configured_ = true;
        if (!found->up()) {
            found->instance_ = instance;
            found->instance_known_ = true;
        }
    }
    // Workers it no longer runs (it restarted with fewer): no more dialing.
    for (size_t i = 0; i < peers_.size();) {
        Peer& p = *peers_[i];
        if (p.configured_ && p.remote_worker_ >= workers && !p.up() && !p.dialing_ && !p.connecting_ && same(p)) {
            if (p.link_) link_closed(p);
            eng_.routes().remove(&p);
            peers_.erase(peers_.begin() + long(i));
        } else {
            ++i;
        }
    }
}

std::string Fabric::overlap(const Peer& self, const Hello& h) const {
    const uint16_t first = h.lid_first, last = h.lid_last;
    if (first <= cfg_.lid_last && last >= cfg_.lid_first)
        return "its LIDs " + std::to_string(first) + "-" + std::to_string(last) + " overlap this shim's " +
               std::to_string(cfg_.lid_first) + "-" + std::to_string(cfg_.lid_last);
    for (auto& p : peers_) {
        // (Other workers of the same shim own the same LIDs.)
        if (p.get() == &self || !p->up() || std::memcmp(p->instance_.data(), h.instance, p->instance_.size()) == 0)
            continue;
        if (first <= p->lid_last_ && last >= p->lid_first_)
            return "its LIDs " + std::to_string(first) + "-" + std::to_string(last) + " overlap those of peer " +
                   p->address_ + " (" + std::to_string(p->lid_first_) + "-" + std::to_string(p->lid_last_) + ")";
    }
    return {};
}

Peer* Fabric::find_peer(const sockaddr_in& ip, const Hello& hello, Peer* dialer) {
    if (dialer) return dialer;
    // Accepted: the dialer said which of its workers it is (mine()).
    const uint8_t w = hello.worker;
    for (auto& p : peers_)
        if (p->remote_worker_ == w && std::memcmp(p->instance_.data(), hello.instance, p->instance_.size()) == 0)
            return p.get();
    for (auto& p : peers_)
        if (p->remote_worker_ == w && p->addr_.sin_addr.s_addr == ip.sin_addr.s_addr &&
            ntohs(p->addr_.sin_port) == hello.listen_port)
            return p.get();
    // A shim this one was not told about, which proved it knows the key.
    sockaddr_in a = ip;
    a.sin_port = htons(hello.listen_port);
    std::string name = hello.listen_port ? endpoint_text(a) : ip_text(a) + " (not listening)";
    peers_.push_back(std::make_unique<Peer>(name, a, false, w));
    return peers_.back().get();
}

void Fabric::establish(Pending& pd) {
    Link& l = *pd.link;
    const Hello& h = l.peer_hello();
    sockaddr_in ip{};
    std::string err;
    parse_endpoint(l.remote(), ip, err);
    Peer* p = find_peer(ip, h, pd.dialer);
    if (pd.dialer) pd.dialer->dialing_ = false;

    // Two connections to the same shim (both dialed): both sides keep the
    // one opened by the shim with the smaller instance id.
    const bool same_instance = std::memcmp(p->instance_.data(), h.instance, p->instance_.size()) == 0;
    if (p->up() && same_instance) {
        bool keep_new = (std::memcmp(instance_.data(), h.instance, instance_.size()) < 0) == l.dialed();
        if (!keep_new) {
            l.close("duplicate connection");
            return;
        }
        p->link_->close(kReplaced);
    }
    // Another instance at that peer's address while the link is live: it
    // may be the peer restarted (its old connection reset, or silent since)
    // or someone else with the key; a live, talking link is kept.
    if (p->up() && !same_instance) {
        p->link_->on_readable();  // a reset that arrived is noticed now
        if (p->link_->state() == LinkState::Up && monotonic_ns() - p->link_->last_rx_ns() < kReplaceSilentNs) {
            ++counters_.replace_refused;
            LOG_WARN("fabric: connection %s %s refused: peer %s has a live link", l.dialed() ? "to" : "from",
                     l.remote().c_str(), p->address_.c_str());
            // Told to the other side; closed once written.
            l.refuse("this shim has a live link to your address's shim");
            l.flush();
            pending_.push_back(std::move(pd));
            pending_.back().dialer = nullptr;
            return;
        }
    }
    std::string why = overlap(*p, h);
    if (!why.empty()) {
        LOG_ERR("fabric: peer %s refused: %s", p->address_.c_str(), why.c_str());
        p->last_error_ = why;
        p->refused_ = true;
        l.refuse(why);
        l.flush();
        // The link closes once the reason is written; keep it until then.
        pending_.push_back(std::move(pd));
        pending_.back().dialer = nullptr;
        return;
    }
    if (p->link_ && p->link_->state() != LinkState::Closed) {
        p->link_->close("the peer restarted");
    }
    if (p->link_) link_closed(*p);
    // The peer's guests are routed here as the link announces them (their
    // partitions, Link::release); none before.
    eng_.routes().remove(p);
    // LIDs of other shims that are down and overlap this one do not stay
    // routed to them.
    for (auto& o : peers_)
        if (o.get() != p && !o->up() && h.lid_first <= o->lid_last_ && h.lid_last >= o->lid_first_ &&
            std::memcmp(o->instance_.data(), h.instance, o->instance_.size()) != 0)
            eng_.routes().remove(o.get());
    std::memcpy(p->instance_.data(), h.instance, p->instance_.size());
    p->lid_first_ = h.lid_first;
    p->lid_last_ = h.lid_last;
    // A peer's device is used only if this shim has one too.
    static const uint8_t kNoGid[16] = {};
    std::memcpy(p->device_gid_, h.device_gid, sizeof(p->device_gid_));
    p->has_device_ = eng_.device_gid() && std::memcmp(h.device_gid, kNoGid, sizeof(kNoGid)) != 0;
    p->remote_workers_ = h.workers;
    p->link_ = std::move(pd.link);
    p->link_->release(eng_, p);
    p->ever_up_ = true;
    p->instance_known_ = true;
    p->defer_until_ns_ = 0;
    p->handshake_wait_until_ns_ = 0;
    p->refused_ = false;
    p->last_error_.clear();
    p->backoff_ns_ = 0;
    LOG_INFO("fabric: peer %s up: lids %u-%u (connection %s %s, worker %u to its worker %u; TLS 1.3 handshake, %s "
             "frames)",
             p->address_.c_str(), h.lid_first, h.lid_last, p->link_->dialed() ? "to" : "from",
             p->link_->remote().c_str(), cfg_.worker, p->remote_worker_, crypto_mode_name(cfg_.crypto));
    watch(*p->link_, false);
    // Worker 0 dialed the peer's worker 0: the other pairs of workers are
    // dialed now, by this shim's workers and the peer's.
    if (p->configured_ && p->remote_worker_ == 0 && cfg_.worker == 0) {
        configure_workers(p->address_, p->addr_, p->instance_, h.workers, 1);
        if (cfg_.learned) cfg_.learned(p->address_, p->addr_, p->instance_, h.workers);
    }
    announce_all_ud(*p);
    // The connection manager of each shim talks to the other's through
    // their workers 0.
    if (cfg_.worker == 0 && p->remote_worker_ == 0) {
        const uint16_t first = h.lid_first, last = h.lid_last;
        p->link_->on_cm = [this, first, last](uint16_t src_lid, const uint8_t* msg, size_t len) {
            if (cfg_.cm_received) cfg_.cm_received(first, last, src_lid, msg, len);
        };
        if (cfg_.cm_peer) cfg_.cm_peer(first, last, true);
    }
    // Requesters waiting for room or a route try again.
    eng_.rescan_all();
}

bool Fabric::send_cm(uint16_t peer_first, uint16_t src_lid, const uint8_t* msg, size_t len) {
    for (auto& p : peers_)
        if (p->remote_worker_ == 0 && p->up() && p->lid_first_ == peer_first)
            return p->link_->send_cm(src_lid, msg, len);
    return false;
}

void Fabric::link_closed(Peer& p) {
    Link& l = *p.link_;
    const std::string& why = l.close_reason();
    if (l.tampered()) ++counters_.tampered;
    if (why != kReplaced && why != p.last_error_) LOG_WARN("fabric: peer %s down: %s", p.address_.c_str(), why.c_str());
    if (why != kReplaced && cfg_.worker == 0 && p.remote_worker_ == 0 && cfg_.cm_peer && p.ever_up_)
        cfg_.cm_peer(p.lid_first_, p.lid_last_, false);
    LinkStats s = l.stats;
    p.past_.tx_bytes += s.tx_bytes;
    p.past_.rx_bytes += s.rx_bytes;
    p.past_.tx_payload += s.tx_payload;
    p.past_.rx_payload += s.rx_payload;
    p.past_.tx_msgs += s.tx_msgs;
    p.past_.rx_msgs += s.rx_msgs;
    p.past_.retries += s.retries;
    p.past_.errors += s.errors;
    p.past_.foreign_lid += s.foreign_lid;
    p.past_.foreign_pkey += s.foreign_pkey;
    p.refused_ = why.rfind("refused", 0) == 0;
    p.next_dial_ns_ = p.refused_ ? monotonic_ns() + kRefusedRedialNs : 0;
    if (why != kReplaced) p.last_error_ = why;
    p.ud_saved_ = std::move(l.ud_owners);
    p.link_.reset();
    p.defer_until_ns_ = 0;  // (a deferred dial waits again, once)
    p.handshake_wait_until_ns_ = 0;
    eng_.rescan_all();
}

uint64_t Fabric::next_deadline_ns() const {
    uint64_t best = 0;
    auto take = [&](uint64_t t) {
        if (t && (!best || t < best)) best = t;
    };
    for (auto& pd : pending_) take(pd.deadline_ns);
    for (auto& p : peers_)
        if (p->link_) take(p->link_->ack_due_ns());
    // Input OpenSSL already read from a socket: epoll will not report it.
    for (auto& p : peers_)
        if (p->link_ && p->link_->input_buffered()) take(1);
    for (auto& p : peers_)
        if (p->configured_ && !p->up() && !p->dialing_ && !p->connecting_)
            take(std::max<uint64_t>({p->next_dial_ns_, p->defer_until_ns_, p->handshake_wait_until_ns_, 1}));
    return best;
}

LinkStats Fabric::totals() const {
    LinkStats sum;
    for (auto& p : peers_) {
        LinkStats t = p->totals();
        sum.tx_bytes += t.tx_bytes;
        sum.rx_bytes += t.rx_bytes;
        sum.tx_payload += t.tx_payload;
        sum.rx_payload += t.rx_payload;
        sum.tx_msgs += t.tx_msgs;
        sum.rx_msgs += t.rx_msgs;
        sum.retries += t.retries;
        sum.errors += t.errors;
        sum.foreign_lid += t.foreign_lid;
        sum.foreign_pkey += t.foreign_pkey;
    }
    return sum;
}

std::vector<Fabric::PeerInfo> Fabric::peer_info() const {
    std::vector<PeerInfo> out;
    for (auto& p : peers_) {
        const char* state = p->up() ? "up" : p->refused_ ? "refused" : (p->configured_ ? "connecting" : "down");
        out.push_back({p->address_, cfg_.worker, p->remote_worker_, state, p->lid_first_, p->lid_last_, p->totals()});
    }
    return out;
}

void Fabric::announce_partitions(uint16_t lid, const std::vector<uint16_t>& pkeys) {
    for (auto& p : peers_)
        if (p->up()) p->link_->send_partitions(lid, pkeys);
}

std::string Fabric::status() const {
    std::string out;
    const std::vector<PeerInfo> info = peer_info();
    for (size_t i = 0; i < info.size(); ++i) {
        const PeerInfo& p = info[i];
        const LinkStats& t = p.totals;
        char line[512];
        std::snprintf(line, sizeof(line),
                      "peer %s state %s lids %u-%u tx_bytes %llu rx_bytes %llu tx_msgs %llu rx_msgs %llu retries %llu "
                      "errors %llu",
                      p.address.c_str(), p.state, p.lid_first, p.lid_last, (unsigned long long)t.tx_bytes,
                      (unsigned long long)t.rx_bytes, (unsigned long long)t.tx_msgs, (unsigned long long)t.rx_msgs,
                      (unsigned long long)t.retries, (unsigned long long)t.errors);
        out += line;
        if (cfg_.workers > 1 || peers_[i]->remote_workers_ > 1)
            out += " worker " + std::to_string(p.worker) + " peer_worker " + std::to_string(p.peer_worker);
        if (!peers_[i]->up() && !peers_[i]->last_error_.empty()) out += " last_error \"" + peers_[i]->last_error_ + "\"";
        out += "\n";
    }
    if (out.empty()) out = "no peers\n";
    const LinkStats t = totals();
    char line[512];
    std::snprintf(line, sizeof(line),
                  "fabric crypto %s handshake_failed %llu handshake_timeout %llu mode_mismatch %llu tampered %llu "
                  "flood_refused %llu replace_refused %llu foreign_lid %llu foreign_pkey %llu\n",
                  crypto_mode_name(cfg_.crypto), (unsigned long long)counters_.handshake_failed,
                  (unsigned long long)counters_.handshake_timeout, (unsigned long long)counters_.mode_mismatch,
                  (unsigned long long)counters_.tampered, (unsigned long long)counters_.flood_refused,
                  (unsigned long long)counters_.replace_refused, (unsigned long long)t.foreign_lid,
                  (unsigned long long)t.foreign_pkey);
    out += line;
    return out;
}

}  // namespace vrdma::shim::fabric
