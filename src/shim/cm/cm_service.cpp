// The CM exchange between two ids of this shim's guests, done in place:
// what the kernel's IB CM does with REQ, REP, RTU, REJ, DREQ, DREP and
// SIDR messages becomes a change of both ids' states and an event queued
// on each side that the kernel would have reported.
#include "cm_service.h"

#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>

#include "guest_fd.h"
#include "secure_random.h"
#include "vrdma_common/log.h"

namespace vrdma::shim::cm {
namespace {

constexpr uint32_t kUdpQkey = 0x01234567;    // RDMA_UDP_QKEY: librdmacm's, and the kernel's
constexpr int32_t kRejInvalidServiceId = 8;  // IB CM REJ reason: nobody listens there
constexpr int32_t kRejConsumerDefined = 28;  // IB CM REJ reason: the peer rejected (or went away)
constexpr int32_t kSidrUnsupported = 1;      // SIDR REP status: nobody listens there
constexpr uint16_t kEphemeralFirst = 32768, kEphemeralCount = 28232;  // Linux's default range

}  // namespace

void CmService::set_guest(size_t index, CmGuest g) { guests_[index] = std::move(g); }

void CmService::remove_guest(size_t index) {
    std::vector<uint64_t> doomed;
    for (auto& [cid, ch] : channels_)
        if (ch.guest == index) doomed.push_back(cid);
    for (uint64_t cid : doomed) close_channel(cid);
    guests_.erase(index);
}

uint64_t CmService::add_connection(size_t index, UniqueFd sock) {
    if (!guests_.count(index) || guest_channels_[index] >= kMaxChannels) return 0;
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

void CmService::drop_id(uint32_t handle) {
    Id* idp = id_of(handle);
    if (!idp) return;
    Id& id = *idp;
    // What the kernel's CM sends for an id destroyed in each state.
    Id* peer = id.peer ? id_of(id.peer) : nullptr;
    if (peer) {
        peer->peer = 0;
        switch (id.state) {
        case State::Connecting:  // our REQ is withdrawn: the request it made is rejected
        case State::ReqReceived: // a request never answered is rejected
            if (peer->state == State::ReqReceived || peer->state == State::Connecting) {
                peer->state = State::Closed;
                queue(*peer, kRejected, kRejConsumerDefined, peer->uid);
            }
            break;
        case State::RepSent:
        case State::RepReceived:
        case State::Established:
        case State::DreqReceived:  // destroy sends the DREP we owed
            peer_disconnected(*peer);
            break;
        default:
            break;
        }
    }
    if (id.state == State::ReqReceived || id.state == State::RepSent)
        if (Id* l = id_of(id.listener); l && l->pending) --l->pending;
    // Its undelivered events go, and their counts with them; so do the
    // ids of connection requests it was never told of.
    std::vector<uint32_t> unannounced;
    if (auto cit = channels_.find(id.channel); cit != channels_.end()) {
        Channel& ch = cit->second;
        std::deque<Event> keep;
        for (Event& e : ch.events) {
            if (e.handle == handle) {
                guest_pipe_take(ch.pipe_r.get());
                if (e.resp.event == kConnectRequest) unannounced.push_back(e.resp.id);
            } else {
                keep.push_back(e);
            }
        }
        ch.events.swap(keep);
        ch.ids.erase(handle);
    }
    if (id.bound) {
        auto pit = ports_.find(PortKey{id.guest, id.ps, id.src.port});
        if (pit != ports_.end()) {
            std::erase(pit->second, handle);
            if (pit->second.empty()) ports_.erase(pit);
        }
    }
    --guest_ids_[id.guest];
    ids_.erase(handle);
    for (uint32_t child : unannounced) drop_id(child);
}

void CmService::peer_disconnected(Id& id) {
    switch (id.state) {
    case State::RepSent:
    case State::RepReceived:
    case State::Established:
        id.state = State::DreqReceived;
        queue(id, kDisconnected, 0, id.uid);
        break;
    case State::DreqSent:  // the DREP we waited for
        id.state = State::Closed;
        queue(id, kDisconnected, 0, id.uid);
        break;
    default:
        break;
    }
    if (id.state == State::DreqReceived && !id.peer) id.state = State::Closed;  // nobody to DREP
}

bool CmService::owns(size_t guest, const IpAddress& ip) const {
    auto it = guests_.find(guest);
    if (it == guests_.end()) return false;
    return std::find(it->second.addrs.begin(), it->second.addrs.end(), ip) != it->second.addrs.end();
}

bool CmService::guest_of(const IpAddress& ip, size_t self, size_t& out) const {
    if (ip.is_any() || ip.is_loopback() || owns(self, ip)) {
        out = self;
        return true;
    }
    for (auto& [index, g] : guests_)
        if (std::find(g.addrs.begin(), g.addrs.end(), ip) != g.addrs.end()) {
            out = index;
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
    size_t peer_guest = 0;
    const bool known = guest_of(dst.ip, id->guest, peer_guest);
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

CmService::Id* CmService::find_listener(size_t guest, uint16_t ps, const Endpoint& dst) {
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
    if (id->state != State::Listen)
        LOG_INFO("guest %s: rdma_cm: listening on %s port %u (%s)", guests_.at(id->guest).name.c_str(),
                 id->src.ip.is_any() ? "*" : id->src.ip.str().c_str(), id->src.port,
                 id->ps == RDMA_PS_UDP ? "udp" : id->ps == RDMA_PS_IB ? "ib" : id->ps == RDMA_PS_IPOIB ? "ipoib" : "tcp");
    id->state = State::Listen;
    id->backlog = c.backlog > 0 && c.backlog < 1024 ? c.backlog : 1024;
    return 0;
}

int CmService::connect(Channel& ch, const rdma_ucm_connect& c) {
    Id* idp = find(ch, c.id);
    if (!idp) return ENOENT;
    Id& id = *idp;
    if (id.state != State::RouteResolved) return EINVAL;
    const bool ud = id.qp_type == IBV_QPT_UD;
    id.qp_num = c.conn_param.qp_num & 0xffffff;
    id.srq = c.conn_param.srq;
    id.responder_resources = c.conn_param.responder_resources;
    id.initiator_depth = c.conn_param.initiator_depth;
    id.retry_count = std::min<uint8_t>(c.conn_param.retry_count, 7);
    id.rnr_retry_count = std::min<uint8_t>(c.conn_param.rnr_retry_count, 7);
    id.state = State::Connecting;

    Id* l = guests_.count(id.peer_guest) ? find_listener(id.peer_guest, id.ps, id.dst) : nullptr;
    if (!l) {
        id.state = State::Closed;
        if (ud) queue(id, kUnreachable, kSidrUnsupported, id.uid);
        else queue(id, kRejected, kRejInvalidServiceId, id.uid);
        return 0;
    }
    auto lch = channels_.find(l->channel);
    if (l->pending >= l->backlog || guest_ids_[l->guest] >= kMaxIds || lch == channels_.end()) {
        id.state = State::Closed;  // dropped, as a full backlog drops a REQ: the sender times out
        queue(id, kUnreachable, -ETIMEDOUT, id.uid);
        return 0;
    }
    ++l->pending;
    Id& p = new_id(lch->second, l->ps, l->qp_type, 0);
    id.peer = p.handle;
    p.peer = id.handle;
    p.listener = l->handle;
    p.state = State::ReqReceived;
    p.src = id.dst;
    p.src.port = l->src.port;
    p.dst = id.src;
    p.dst_known = true;
    p.peer_guest = id.guest;
    p.retry_count = id.retry_count;
    p.reuseaddr = l->reuseaddr;
    // Until ACCEPT says otherwise, the passive side serves as many reads as
    // the active side may issue, and issues as many as it serves.
    p.responder_resources = id.initiator_depth;
    p.initiator_depth = id.responder_resources;

    Event& e = queue_event(p, kConnectRequest, 0);
    e.handle = l->handle;  // the listener's event (librdmacm acks it on the listener), about the new id
    e.resp.uid = l->uid;
    if (ud) {
        rdma_ucm_ud_param& u = e.resp.param.ud;
        fill_ah(u.ah_attr, p);
        u.private_data_len = c.conn_param.private_data_len;
        std::memcpy(u.private_data, c.conn_param.private_data, u.private_data_len);
    } else {
        p.peer_qp_num = id.qp_num;
        p.peer_psn = id.psn;
        fill_conn(e.resp.param.conn, id, c.conn_param.private_data, c.conn_param.private_data_len);
        // What the peer can do for us is what we may do to it.
        e.resp.param.conn.responder_resources = id.initiator_depth;
        e.resp.param.conn.initiator_depth = id.responder_resources;
        e.resp.ece = c.ece;
    }
    return 0;
}

int CmService::accept(Channel& ch, const rdma_ucm_accept& c) {
    Id* idp = find(ch, c.id);
    if (!idp) return ENOENT;
    Id& id = *idp;
    Id* peer = id.peer ? id_of(id.peer) : nullptr;
    if (id.state == State::RepReceived) {  // the active side's RTU
        if (!peer) return EINVAL;
        id.state = State::Established;
        if (peer->state == State::RepSent) {
            peer->state = State::Established;
            queue(*peer, kEstablished, 0, peer->uid);
        }
        return 0;
    }
    if (id.state != State::ReqReceived || !c.conn_param.valid) return EINVAL;
    if (!peer || peer->state != State::Connecting) return EINVAL;
    id.uid = c.uid;
    id.qp_num = c.conn_param.qp_num & 0xffffff;
    id.srq = c.conn_param.srq;
    id.responder_resources = c.conn_param.responder_resources;
    id.initiator_depth = c.conn_param.initiator_depth;
    id.rnr_retry_count = std::min<uint8_t>(c.conn_param.rnr_retry_count, 7);
    if (Id* l = id_of(id.listener); l && l->pending) --l->pending;
    id.listener = 0;
    if (id.qp_type == IBV_QPT_UD) {  // the SIDR REP
        if (c.conn_param.qkey) id.qkey = c.conn_param.qkey;
        id.state = State::Established;
        peer->state = State::Established;
        Event& e = queue_event(*peer, kEstablished, 0);
        rdma_ucm_ud_param& u = e.resp.param.ud;
        fill_ah(u.ah_attr, *peer);
        u.qp_num = id.qp_num;
        u.qkey = id.qkey;
        u.private_data_len = c.conn_param.private_data_len;
        std::memcpy(u.private_data, c.conn_param.private_data, u.private_data_len);
        return 0;
    }
    id.state = State::RepSent;
    peer->state = State::RepReceived;
    peer->peer_qp_num = id.qp_num;
    peer->peer_psn = id.psn;
    // The active side may read and write as far as we let it.
    peer->initiator_depth = std::min(peer->initiator_depth, id.responder_resources);
    peer->responder_resources = std::min(peer->responder_resources, id.initiator_depth);
    Event& e = queue_event(*peer, kConnectResponse, 0);
    fill_conn(e.resp.param.conn, id, c.conn_param.private_data, c.conn_param.private_data_len);
    e.resp.param.conn.responder_resources = id.initiator_depth;
    e.resp.param.conn.initiator_depth = id.responder_resources;
    e.resp.ece = c.ece;
    return 0;
}

int CmService::reject(Channel& ch, const rdma_ucm_reject& c) {
    Id* idp = find(ch, c.id);
    if (!idp) return ENOENT;
    Id& id = *idp;
    if (id.state != State::ReqReceived) return EINVAL;
    id.state = State::Closed;
    if (Id* l = id_of(id.listener); l && l->pending) --l->pending;
    Id* peer = id.peer ? id_of(id.peer) : nullptr;
    if (!peer) return 0;
    peer->peer = 0;
    id.peer = 0;
    peer->state = State::Closed;
    if (peer->qp_type == IBV_QPT_UD) {
        Event& e = queue_event(*peer, kUnreachable, c.reason ? c.reason : 2 /* SIDR REJECT */);
        e.resp.param.ud.private_data_len = c.private_data_len;
        std::memcpy(e.resp.param.ud.private_data, c.private_data, c.private_data_len);
    } else {
        Event& e = queue_event(*peer, kRejected, c.reason ? c.reason : kRejConsumerDefined);
        e.resp.param.conn.private_data_len = c.private_data_len;
        std::memcpy(e.resp.param.conn.private_data, c.private_data, c.private_data_len);
    }
    return 0;
}

int CmService::disconnect(Channel& ch, uint32_t handle) {
    Id* idp = find(ch, handle);
    if (!idp) return ENOENT;
    Id& id = *idp;
    Id* peer = id.peer ? id_of(id.peer) : nullptr;
    switch (id.state) {
    case State::RepSent:
    case State::RepReceived:
    case State::Established:  // DREQ
        id.state = State::DreqSent;
        if (peer) {
            peer_disconnected(*peer);
        } else {  // nobody will DREP
            id.state = State::Closed;
            queue(id, kDisconnected, 0, id.uid);
        }
        return 0;
    case State::DreqReceived:  // DREP
        id.state = State::Closed;
        if (peer) {
            peer->peer = 0;
            id.peer = 0;
            peer_disconnected(*peer);
        }
        return 0;
    case State::DreqSent:
    case State::Closed:
        return 0;
    default:
        return EINVAL;
    }
}

void CmService::queue(Id& id, uint32_t event, int32_t status, uint64_t uid) {
    Event& e = queue_event(id, event, status);
    e.resp.uid = uid;
}

CmService::Event& CmService::queue_event(Id& id, uint32_t event, int32_t status) {
    Channel& ch = channels_.at(id.channel);
    // A guest that never reads its events loses the oldest, not the shim's memory.
    if (ch.events.size() >= kMaxEvents) {
        LOG_WARN("guest %s: rdma_cm channel %llu holds %u unread events; dropping the oldest",
                 guests_.count(ch.guest) ? guests_.at(ch.guest).name.c_str() : "?", (unsigned long long)ch.id,
                 kMaxEvents);
        ch.events.pop_front();
    } else if (const uint8_t b = 1; guest_fd_write(ch.pipe_w.get(), &b, 1) != 1) {
        LOG_WARN("guest %s: rdma_cm channel %llu: its pipe takes no more events",
                 guests_.count(ch.guest) ? guests_.at(ch.guest).name.c_str() : "?", (unsigned long long)ch.id);
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

void CmService::fill_conn(rdma_ucm_conn_param& p, const Id& from, const uint8_t* pdata, uint8_t pdata_len) {
    p.qp_num = from.qp_num;
    p.srq = from.srq;
    p.retry_count = from.retry_count;
    p.rnr_retry_count = from.rnr_retry_count;
    p.flow_control = 1;
    p.private_data_len = pdata_len;  // a u8: within the 256 bytes
    std::memcpy(p.private_data, pdata, p.private_data_len);
}

void CmService::gid_of(size_t guest, uint8_t gid[16]) const {
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
