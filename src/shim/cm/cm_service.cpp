// The connection manager's state: guests and their addresses (this shim's
// and its peers'), channels, ids, port spaces, resolution, and the events
// queued for the guests. The exchange between ids is cm_exchange.cpp.
#include "cm_service.h"

#include <endian.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>

#include "engine.h"
#include "secure_random.h"
#include "vrdma_common/log.h"

namespace vrdma::shim::cm {
namespace {

constexpr uint32_t kUdpQkey = 0x01234567;    // RDMA_UDP_QKEY: librdmacm's, and the kernel's
constexpr uint16_t kEphemeralFirst = 32768, kEphemeralCount = 28232;  // Linux's default range

}  // namespace

void CmService::set_guest(size_t index, CmGuest g) {
    g.remote = false;
    guests_[index] = std::move(g);
    announce(index, false);
}

void CmService::remove_guest(size_t index) {
    std::vector<uint64_t> doomed;
    for (auto& [cid, ch] : channels_)
        if (ch.guest == index) doomed.push_back(cid);
    for (uint64_t cid : doomed) close_channel(cid);
    if (guests_.count(index)) announce(index, true);
    guests_.erase(index);
}

namespace {

CmAddressMsg address_msg(const CmGuest& g, bool gone) {
    CmAddressMsg a{};
    a.op = uint8_t(CmOp::Addresses);
    a.lid = g.lid;
    a.pkey = g.pkey;
    a.guid = g.guid;
    if (!gone)
        for (const IpAddress& ip : g.addrs) {
            if (a.count == 16) break;
            a.addrs[a.count].family = uint8_t(ip.family);
            std::memcpy(a.addrs[a.count].ip, ip.bytes, 16);
            ++a.count;
        }
    return a;
}

}  // namespace

void CmService::announce(uint64_t guest, bool gone) {
    auto it = guests_.find(guest);
    if (it == guests_.end() || it->second.remote || !outbox_) return;
    const CmAddressMsg a = address_msg(it->second, gone);
    for (const auto& [first, last] : peers_)
        outbox_(first, it->second.lid, reinterpret_cast<const uint8_t*>(&a), sizeof(a));
}

void CmService::peer_up(uint16_t first, uint16_t last) {
    peers_.insert({first, last});
    if (!outbox_) return;
    for (const auto& [key, g] : guests_) {
        if (g.remote) continue;
        const CmAddressMsg a = address_msg(g, false);
        outbox_(first, g.lid, reinterpret_cast<const uint8_t*>(&a), sizeof(a));
    }
}

void CmService::peer_down(uint16_t first, uint16_t last) {
    peers_.erase({first, last});
    std::vector<uint32_t> lost;
    for (auto& [h, id] : ids_)
        if (id.peer_guest >= kRemoteKey && id.peer_guest - kRemoteKey >= first && id.peer_guest - kRemoteKey <= last)
            lost.push_back(h);
    for (uint32_t h : lost)
        if (Id* id = id_of(h)) peer_lost(*id);
    for (auto it = guests_.begin(); it != guests_.end();)
        it = it->second.remote && it->second.lid >= first && it->second.lid <= last ? guests_.erase(it) : std::next(it);
}

void CmService::from_peer(uint16_t first, uint16_t last, uint16_t src_lid, const uint8_t* msg, size_t len) {
    if (len < 1 || msg[0] < uint8_t(CmOp::Req) || msg[0] > kCmOpLast) return;
    if (msg[0] == uint8_t(CmOp::Addresses)) {
        if (len != sizeof(CmAddressMsg)) return;
        CmAddressMsg a;
        std::memcpy(&a, msg, sizeof(a));
        if (a.lid == src_lid) on_addresses(first, last, a);
        return;
    }
    if (len != sizeof(CmMsg)) return;
    CmMsg m;
    std::memcpy(&m, msg, sizeof(m));
    uint64_t dst;
    // From the guest of that peer that sent it, to one of ours: anything
    // else is dropped.
    if (m.src_lid != src_lid || m.src_lid < first || m.src_lid > last || !guest_by_lid(m.dst_lid, dst) ||
        dst >= kRemoteKey)
        return;
    if ((m.op == uint8_t(CmOp::Req) || m.op == uint8_t(CmOp::SidrReq)) && m.family != AF_INET && m.family != AF_INET6)
        return;
    receive(m);
}

void CmService::on_addresses(uint16_t first, uint16_t last, const CmAddressMsg& a) {
    if (a.lid < first || a.lid > last || a.count > 16) return;
    const uint64_t key = kRemoteKey + a.lid;
    if (a.count == 0) {  // the guest is gone
        std::vector<uint32_t> lost;
        for (auto& [h, id] : ids_)
            if (id.peer_guest == key) lost.push_back(h);
        for (uint32_t h : lost)
            if (Id* id = id_of(h)) peer_lost(*id);
        guests_.erase(key);
        return;
    }
    CmGuest g;
    g.name = "lid " + std::to_string(a.lid);
    g.lid = a.lid;
    g.guid = a.guid;
    g.pkey = a.pkey;
    g.remote = true;
    g.peer_first = first;
    for (uint8_t i = 0; i < a.count; ++i) {
        IpAddress ip;
        ip.family = a.addrs[i].family;
        if (ip.family != AF_INET && ip.family != AF_INET6) continue;
        std::memcpy(ip.bytes, a.addrs[i].ip, 16);
        if (ip.family == AF_INET) std::memset(ip.bytes + 4, 0, 12);
        if (ip.is_any() || ip.is_loopback()) continue;
        uint64_t other;
        // An address another guest has already (one of ours, or one a
        // peer announced first) stays that guest's.
        if (guest_of(ip, key, other) && other != key) {
            LOG_WARN("rdma_cm: the peer shim of lids %u-%u announced %s for lid %u, which is another guest's: ignored",
                     first, last, ip.str().c_str(), a.lid);
            continue;
        }
        g.addrs.push_back(ip);
    }
    guests_[key] = std::move(g);
}

uint64_t CmService::add_connection(size_t index, UniqueFd sock) {
    if (!guests_.count(index) || guests_.at(index).remote || guest_channels_[index] >= kMaxChannels) return 0;
    ++guest_channels_[index];
    const uint64_t cid = next_channel_++;
    Channel& ch = channels_[cid];
    ch.id = cid;
    ch.guest = index;
    ch.sock = std::move(sock);
    return cid;
}

int CmService::socket_of(uint64_t channel) const {
    auto it = channels_.find(channel);
    return it == channels_.end() ? -1 : it->second.sock.get();
}

void CmService::close_channel(uint64_t channel) {
    auto it = channels_.find(channel);
    if (it == channels_.end()) return;
    close_channel_ids(it->second);
    --guest_channels_[it->second.guest];
    channels_.erase(it);
}

void CmService::close_channel_ids(Channel& ch) {
    const std::vector<uint32_t> ids(ch.ids.begin(), ch.ids.end());
    for (uint32_t h : ids) drop_id(h);
}

CmService::Id* CmService::find(const Channel& ch, uint32_t handle) {
    if (!ch.ids.count(handle)) return nullptr;  // another channel's (or guest's) id is not there
    return id_of(handle);
}

CmService::Id* CmService::id_of(uint32_t handle) {
    auto it = ids_.find(handle);
    return it == ids_.end() ? nullptr : &it->second;
}

CmService::Id& CmService::new_id(Channel& ch, uint16_t ps, uint8_t qp_type, uint64_t uid) {
    while (!next_handle_ || ids_.count(next_handle_)) ++next_handle_;
    const uint32_t h = next_handle_++;
    Id& id = ids_[h];
    id.handle = h;
    id.uid = uid;
    id.channel = ch.id;
    id.guest = ch.guest;
    id.ps = ps;
    id.qp_type = qp_type;
    id.qkey = kUdpQkey;
    id.psn = secure_random_u32() & 0xffffff;
    ch.ids.insert(h);
    ++guest_ids_[ch.guest];
    return id;
}

bool CmService::owns(uint64_t guest, const IpAddress& ip) const {
    auto it = guests_.find(guest);
    if (it == guests_.end()) return false;
    return std::find(it->second.addrs.begin(), it->second.addrs.end(), ip) != it->second.addrs.end();
}

bool CmService::guest_of(const IpAddress& ip, uint64_t self, uint64_t& out) const {
    if (ip.is_any() || ip.is_loopback() || owns(self, ip)) {
        out = self;
        return true;
    }
    for (auto& [key, g] : guests_)  // this shim's guests first: their keys are the smaller
        if (std::find(g.addrs.begin(), g.addrs.end(), ip) != g.addrs.end()) {
            out = key;
            return true;
        }
    return false;
}

bool CmService::guest_by_lid(uint16_t lid, uint64_t& out) const {
    for (auto& [key, g] : guests_)
        if (g.lid == lid) {
            out = key;
            return true;
        }
    return false;
}

int CmService::bind(Id& id, const Endpoint& at) {
    if (!at.ip.is_any() && !at.ip.is_loopback() && !owns(id.guest, at.ip)) return EADDRNOTAVAIL;
    auto overlaps = [&](const Id& other) {
        if (other.src.ip.is_any() || at.ip.is_any()) return true;
        return other.src.ip == at.ip;
    };
    auto free_at = [&](uint16_t port) {
        auto it = ports_.find(PortKey{id.guest, id.ps, port});
        if (it == ports_.end()) return true;
        for (uint32_t h : it->second) {
            const Id* o = id_of(h);
            if (!o || !overlaps(*o)) continue;
            if (!(id.reuseaddr && o->reuseaddr) || o->state == State::Listen) return false;
        }
        return true;
    };
    uint16_t port = at.port;
    if (port == 0) {
        bool found = false;
        for (uint32_t n = 0; n < kEphemeralCount && !found; ++n) {
            const uint16_t p = uint16_t(kEphemeralFirst + (next_ephemeral_++ % kEphemeralCount));
            if (free_at(p)) {
                port = p;
                found = true;
            }
        }
        if (!found) return EADDRNOTAVAIL;
    } else if (!free_at(port)) {
        return EADDRINUSE;
    }
    id.src = at;
    id.src.port = port;
    id.bound = true;
    id.state = State::Bound;
    ports_[PortKey{id.guest, id.ps, port}].push_back(id.handle);
    return 0;
}

int CmService::resolve_ip(Channel& ch, const rdma_ucm_resolve_ip& c) {
    Id* id = find(ch, c.id);
    if (!id) return ENOENT;
    Endpoint dst, src;
    if (!endpoint_from_sockaddr(&c.dst_addr, sizeof(c.dst_addr), dst)) return EAFNOSUPPORT;
    const bool has_src = endpoint_from_sockaddr(&c.src_addr, sizeof(c.src_addr), src);
    if (id->state != State::Idle && id->state != State::Bound) return EINVAL;
    if (id->state == State::Idle) {
        if (!has_src) src = Endpoint{};
        src.ip.family = has_src ? src.ip.family : dst.ip.family;
        if (int rc = bind(*id, src)) return rc;
    }
    // A wildcard source becomes the address the destination is reached
    // from: loopback for the guest itself, else its first of the family.
    if (dst.ip.is_any()) {
        dst.ip = IpAddress{};
        dst.ip.family = id->src.ip.family == AF_UNSPEC ? AF_INET : id->src.ip.family;
        if (dst.ip.family == AF_INET) dst.ip.bytes[0] = 127, dst.ip.bytes[3] = 1;
        else dst.ip.bytes[15] = 1;
    }
    uint64_t peer_guest = 0;
    // A multicast group is reached from the guest's own port: the id is
    // resolved to its own device, for rdma_join_multicast
    // (UD ids only: a connection to a multicast address goes nowhere.)
    const bool group = dst.ip.is_multicast() && id->qp_type == IBV_QPT_UD;
    const bool known = group ? (peer_guest = id->guest, true) : guest_of(dst.ip, id->guest, peer_guest);
    if (id->src.ip.is_any()) {
        const uint16_t port = id->src.port;
        if (dst.ip.is_loopback() || owns(id->guest, dst.ip)) {
            id->src.ip = dst.ip;
        } else {
            const auto& mine = guests_.at(id->guest).addrs;
            auto it = std::find_if(mine.begin(), mine.end(), [&](const IpAddress& a) { return a.family == dst.ip.family; });
            if (it == mine.end()) {
                queue(*id, kAddrError, -ENETUNREACH, id->uid);
                return 0;
            }
            id->src.ip = *it;
        }
        id->src.port = port;
    }
    if (!known) {
        queue(*id, kAddrError, -EHOSTUNREACH, id->uid);
        return 0;
    }
    if (id->src.ip.is_loopback() && peer_guest != id->guest) {  // as the kernel: loopback reaches no other host
        queue(*id, kAddrError, -ENETUNREACH, id->uid);
        return 0;
    }
    id->dst = dst;
    id->dst_known = true;
    id->peer_guest = peer_guest;
    id->state = State::AddrResolved;
    queue(*id, kAddrResolved, 0, id->uid);
    return 0;
}

int CmService::resolve_route(Channel& ch, const rdma_ucm_resolve_route& c) {
    Id* id = find(ch, c.id);
    if (!id) return ENOENT;
    if (id->state != State::AddrResolved) return EINVAL;
    if (!guests_.count(id->peer_guest)) {
        queue(*id, kRouteError, -EHOSTUNREACH, id->uid);
        return 0;
    }
    id->state = State::RouteResolved;
    queue(*id, kRouteResolved, 0, id->uid);
    return 0;
}

CmService::Id* CmService::find_listener(uint64_t guest, uint16_t ps, const Endpoint& dst) {
    auto it = ports_.find(PortKey{guest, ps, dst.port});
    if (it == ports_.end()) return nullptr;
    Id* any = nullptr;
    for (uint32_t h : it->second) {
        Id* l = id_of(h);
        if (!l || l->state != State::Listen) continue;
        if (l->src.ip == dst.ip) return l;
        if (l->src.ip.is_any() && (!l->afonly || l->src.ip.family == dst.ip.family)) any = l;
        if (l->src.ip.is_loopback() && dst.ip.is_loopback() && l->src.ip.family == dst.ip.family) any = l;
    }
    return any;
}

int CmService::listen(Channel& ch, const rdma_ucm_listen& c) {
    Id* id = find(ch, c.id);
    if (!id) return ENOENT;
    if (id->state == State::Idle) {
        Endpoint any;
        any.ip.family = AF_INET6;  // the kernel's default: both families
        if (int rc = bind(*id, any)) return rc;
    }
    if (id->state != State::Bound && id->state != State::Listen) return EINVAL;
    // Another listener on an overlapping address of the same port (only
    // possible with SO_REUSEADDR on both) keeps the port.
    for (uint32_t h : ports_[PortKey{id->guest, id->ps, id->src.port}]) {
        const Id* o = id_of(h);
        if (o && o != id && o->state == State::Listen &&
            (o->src.ip.is_any() || id->src.ip.is_any() || o->src.ip == id->src.ip))
            return EADDRINUSE;
    }
    if (id->state != State::Listen) {
        if (guest_listens_[id->guest] >= kMaxListens) return ENOMEM;
        ++guest_listens_[id->guest];
    }
    if (id->state != State::Listen)
        LOG_INFO("guest %s: rdma_cm: listening on %s port %u (%s)", guests_.at(id->guest).name.c_str(),
                 id->src.ip.is_any() ? "*" : id->src.ip.str().c_str(), id->src.port,
                 id->ps == RDMA_PS_UDP ? "udp" : id->ps == RDMA_PS_IB ? "ib" : id->ps == RDMA_PS_IPOIB ? "ipoib" : "tcp");
    id->state = State::Listen;
    id->backlog = c.backlog > 0 && c.backlog < 1024 ? c.backlog : 1024;
    return 0;
}

bool CmService::warning_due() {
    const uint64_t now = monotonic_ns();
    if (now - last_warning_ns_ < 1'000'000'000) return false;
    last_warning_ns_ = now;
    return true;
}

void CmService::set_state(Id& id, State s) {
    if (id.deadline_ns) {
        timers_.erase({id.deadline_ns, id.handle});
        id.deadline_ns = 0;
    }
    id.state = s;
    if (s == State::DreqSent) {
        id.deadline_ns = monotonic_ns() + kDreqTimeoutNs;
        timers_.insert({id.deadline_ns, id.handle});
    }
}

void CmService::on_timer(uint64_t now_ns) {
    while (!timers_.empty() && timers_.begin()->first <= now_ns) {
        const uint32_t h = timers_.begin()->second;
        timers_.erase(timers_.begin());
        Id* id = id_of(h);
        if (!id) continue;
        id->deadline_ns = 0;
        if (id->state != State::DreqSent) continue;
        set_state(*id, State::Closed);  // the kernel's DREQ timeout
        queue(*id, kDisconnected, -ETIMEDOUT, id->uid);
    }
}

void CmService::undeliverable(const uint8_t* msg, size_t len) {
    if (len != sizeof(CmMsg)) return;  // an address announcement: the peer learns them when it is up again
    CmMsg m;
    std::memcpy(&m, msg, sizeof(m));
    Id* id = id_of(m.src_id);
    if (!id || guests_.count(id->guest) == 0 || guests_.at(id->guest).lid != m.src_lid) return;
    if (id->state == State::DreqSent) {
        set_state(*id, State::Closed);
        queue(*id, kDisconnected, -ETIMEDOUT, id->uid);
        return;
    }
    peer_lost(*id);
}

// A full pipe (the guest kept a write end and filled it) loses the byte:
// only that guest's poll is wrong then.
void CmService::put_byte(Channel& ch) {
    const uint8_t b = 1;
    (void)!::write(ch.pipe_w.get(), &b, 1);
}

void CmService::take_byte(Channel& ch) {
    uint8_t b;
    (void)!::read(ch.pipe_r.get(), &b, 1);  // nothing there: the provider took it, and finds no event
}

void CmService::queue(Id& id, uint32_t event, int32_t status, uint64_t uid) {
    Event& e = queue_event(id, event, status);
    e.resp.uid = uid;
}

CmService::Event& CmService::queue_event(Id& id, uint32_t event, int32_t status) {
    Channel& ch = channels_.at(id.channel);
    // A guest that never reads its events loses the oldest, not the shim's memory.
    if (ch.events.size() >= kMaxEvents) {
        if (warning_due())
            LOG_WARN("guest %s: rdma_cm channel %llu holds %u unread events; dropping the oldest",
                 guests_.count(ch.guest) ? guests_.at(ch.guest).name.c_str() : "?", (unsigned long long)ch.id,
                 kMaxEvents);
        ch.events.pop_front();
    } else {
        put_byte(ch);
    }
    Event& e = ch.events.emplace_back();
    e.handle = id.handle;
    std::memset(&e.resp, 0, sizeof(e.resp));
    e.resp.id = id.handle;
    e.resp.uid = id.uid;
    e.resp.event = event;
    e.resp.status = uint32_t(status);
    return e;
}

void CmService::gid_of(uint64_t guest, uint8_t gid[16]) const {
    std::memset(gid, 0, 16);
    gid[0] = 0xfe;
    gid[1] = 0x80;
    auto it = guests_.find(guest);
    if (it == guests_.end()) return;
    const uint64_t be = htobe64(it->second.guid);
    std::memcpy(gid + 8, &be, 8);
}

// The address vector from `to`'s guest to its peer's.
void CmService::fill_ah(ib_uverbs_ah_attr& ah, const Id& to) const {
    std::memset(&ah, 0, sizeof(ah));
    auto it = guests_.find(to.peer_guest);
    ah.dlid = it == guests_.end() ? 0 : it->second.lid;
    ah.port_num = 1;
}

void CmService::fill_path(ib_user_path_rec& p, const Id& id) const {
    gid_of(id.guest, p.sgid);
    gid_of(id.peer_guest, p.dgid);
    auto self = guests_.find(id.guest);
    auto peer = guests_.find(id.peer_guest);
    p.slid = htobe16(self == guests_.end() ? 0 : self->second.lid);
    p.dlid = htobe16(peer == guests_.end() ? 0 : peer->second.lid);
    p.pkey = htobe16(self == guests_.end() ? 0xffff : self->second.pkey);
    p.reversible = 1;
    p.numb_path = 1;
    p.mtu_selector = 2;  // exactly
    p.mtu = IBV_MTU_4096;
    p.rate_selector = 2;
    p.rate = 7;  // 40 Gb/s, what the port reports
    p.packet_life_time_selector = 2;
    p.packet_life_time = 14;
}

}  // namespace vrdma::shim::cm
