// The CM exchange (cm_wire.h): what the kernel's IB CM does with REQ, REP,
// RTU, REJ, DREQ, DREP and SIDR messages, as changes of the two ids'
// states and the events the kernel reports on each side. A message for a
// guest of this shim is received in place, before the command that sent
// it returns; one for a peer shim's guest leaves through the outbox and is
// received there the same way (from_peer).
#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include "cm_service.h"
#include "vrdma_common/log.h"

namespace vrdma::shim::cm {
namespace {

constexpr int32_t kRejInvalidServiceId = 8;  // IB CM REJ reason: nobody listens there
constexpr int32_t kRejConsumerDefined = 28;  // IB CM REJ reason: the peer rejected (or went away)
constexpr int32_t kSidrUnsupported = 1;      // SIDR REP status: nobody listens there
constexpr int32_t kSidrReject = 2;           // SIDR REP status: the service refused

void conn_of(rdma_ucm_conn_param& p, const CmMsg& m) {
    p.qp_num = m.qp_num;
    p.srq = m.srq;
    p.retry_count = m.retry_count;
    p.rnr_retry_count = m.rnr_retry_count;
    p.flow_control = 1;
    // What the peer can do for us is what we may do to it.
    p.responder_resources = m.initiator_depth;
    p.initiator_depth = m.responder_resources;
    p.private_data_len = m.private_data_len;
    std::memcpy(p.private_data, m.private_data, m.private_data_len);
}

void private_data(CmMsg& m, const uint8_t* data, uint8_t len) {
    m.private_data_len = len;  // a u8: within the 256 bytes
    std::memcpy(m.private_data, data, len);
}

}  // namespace

CmMsg CmService::message(const Id& from, CmOp op) const {
    CmMsg m{};
    m.op = uint8_t(op);
    m.qp_type = from.qp_type;
    m.ps = from.ps;
    m.src_lid = guests_.at(from.guest).lid;
    auto peer = guests_.find(from.peer_guest);
    m.dst_lid = peer == guests_.end() ? 0 : peer->second.lid;
    m.src_id = from.handle;
    m.dst_id = from.peer;
    m.qp_num = from.qp_num;
    m.psn = from.psn;
    m.qkey = from.qkey;
    m.responder_resources = from.responder_resources;
    m.initiator_depth = from.initiator_depth;
    m.retry_count = from.retry_count;
    m.rnr_retry_count = from.rnr_retry_count;
    m.srq = from.srq;
    return m;
}

void CmService::deliver(const CmMsg& m) {
    uint64_t to;
    if (!guest_by_lid(m.dst_lid, to)) return;  // the guest went: the sender learns it as a timeout
    const CmGuest& g = guests_.at(to);
    if (!g.remote) {
        receive(m);
        return;
    }
    if (outbox_) outbox_(g.peer_first, m.src_lid, reinterpret_cast<const uint8_t*>(&m), sizeof(m));
}

void CmService::receive(const CmMsg& m) {
    switch (CmOp(m.op)) {
    case CmOp::Req:
    case CmOp::SidrReq:
        return on_req(m);
    case CmOp::Rep:
        return on_rep(m);
    case CmOp::Rtu:
        return on_rtu(m);
    case CmOp::Rej:
        return on_rej(m);
    case CmOp::Dreq:
        return on_dreq(m);
    case CmOp::Drep:
        return on_drep(m);
    case CmOp::SidrRep:
        return on_sidr_rep(m);
    case CmOp::Addresses:
        return;
    }
}

CmService::Id* CmService::target(const CmMsg& m) {
    Id* id = nullptr;
    if (m.dst_id) {
        id = id_of(m.dst_id);
    } else {  // a Rej that withdraws a Req: the passive id does not know... its peer does
        for (auto& [h, cand] : ids_)
            if (cand.peer == m.src_id && (cand.state == State::ReqReceived || cand.state == State::RepSent) &&
                guests_.count(cand.peer_guest) &&
                guests_.at(cand.peer_guest).lid == m.src_lid) {
                id = &cand;
                break;
            }
    }
    if (!id || guests_.at(id->guest).lid != m.dst_lid) return nullptr;
    auto peer = guests_.find(id->peer_guest);
    if (peer == guests_.end() || peer->second.lid != m.src_lid) return nullptr;
    if (id->peer && id->peer != m.src_id) return nullptr;
    return id;
}

// --- the commands that send ---------------------------------------------

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
    if (!guests_.count(id.peer_guest)) {  // its guest (or shim) went since the route was resolved
        id.state = State::Closed;
        queue(id, kUnreachable, -ETIMEDOUT, id.uid);
        return 0;
    }
    CmMsg m = message(id, ud ? CmOp::SidrReq : CmOp::Req);
    m.dst_id = 0;
    m.family = uint8_t(id.dst.ip.family);
    m.src_port = htons(id.src.port);
    m.dst_port = htons(id.dst.port);
    std::memcpy(m.src_ip, id.src.ip.bytes, 16);
    std::memcpy(m.dst_ip, id.dst.ip.bytes, 16);
    m.ece_vendor = c.ece.vendor_id;
    m.ece_attr = c.ece.attr_mod;
    private_data(m, c.conn_param.private_data, c.conn_param.private_data_len);
    deliver(m);
    return 0;
}

int CmService::accept(Channel& ch, const rdma_ucm_accept& c) {
    Id* idp = find(ch, c.id);
    if (!idp) return ENOENT;
    Id& id = *idp;
    if (id.state == State::RepReceived) {  // the active side's RTU
        id.state = State::Established;
        deliver(message(id, CmOp::Rtu));
        return 0;
    }
    if (id.state != State::ReqReceived || !c.conn_param.valid) return EINVAL;
    id.uid = c.uid;
    id.qp_num = c.conn_param.qp_num & 0xffffff;
    id.srq = c.conn_param.srq;
    id.responder_resources = c.conn_param.responder_resources;
    id.initiator_depth = c.conn_param.initiator_depth;
    id.rnr_retry_count = std::min<uint8_t>(c.conn_param.rnr_retry_count, 7);
    const bool ud = id.qp_type == IBV_QPT_UD;
    if (ud && c.conn_param.qkey) id.qkey = c.conn_param.qkey;
    id.state = ud ? State::Established : State::RepSent;
    CmMsg m = message(id, ud ? CmOp::SidrRep : CmOp::Rep);
    m.ece_vendor = c.ece.vendor_id;
    m.ece_attr = c.ece.attr_mod;
    private_data(m, c.conn_param.private_data, c.conn_param.private_data_len);
    deliver(m);
    return 0;
}

int CmService::reject(Channel& ch, const rdma_ucm_reject& c) {
    Id* idp = find(ch, c.id);
    if (!idp) return ENOENT;
    Id& id = *idp;
    if (id.state != State::ReqReceived) return EINVAL;
    id.state = State::Closed;
    const bool ud = id.qp_type == IBV_QPT_UD;
    CmMsg m = message(id, ud ? CmOp::SidrRep : CmOp::Rej);
    m.status = c.reason ? c.reason : ud ? kSidrReject : kRejConsumerDefined;
    private_data(m, c.private_data, c.private_data_len);
    deliver(m);
    return 0;
}

int CmService::disconnect(Channel& ch, uint32_t handle) {
    Id* idp = find(ch, handle);
    if (!idp) return ENOENT;
    Id& id = *idp;
    switch (id.state) {
    case State::RepSent:
    case State::RepReceived:
    case State::Established:  // DREQ
        set_state(id, State::DreqSent);
        deliver(message(id, CmOp::Dreq));
        return 0;
    case State::DreqReceived:  // DREP
        id.state = State::Closed;
        deliver(message(id, CmOp::Drep));
        return 0;
    case State::DreqSent:
    case State::Closed:
        return 0;
    default:
        return EINVAL;
    }
}

void CmService::drop_id(uint32_t handle) {
    Id* idp = id_of(handle);
    if (!idp) return;
    Id& id = *idp;
    // What the kernel's CM sends for an id destroyed in each state.
    switch (id.state) {
    case State::Connecting:   // the request is withdrawn
    case State::ReqReceived: {  // a request never answered is rejected
        if (id.state == State::Connecting && id.qp_type == IBV_QPT_UD) break;
        CmMsg m = message(id, id.qp_type == IBV_QPT_UD ? CmOp::SidrRep : CmOp::Rej);
        m.status = id.qp_type == IBV_QPT_UD ? kSidrReject : kRejConsumerDefined;
        deliver(m);
        break;
    }
    case State::RepSent:
    case State::RepReceived:
    case State::Established:
        deliver(message(id, CmOp::Dreq));
        break;
    case State::DreqReceived:  // the DREP it owed
        deliver(message(id, CmOp::Drep));
        break;
    default:
        break;
    }
    // Its undelivered events go, and their counts with them; so do the
    // ids of connection requests it was never told of.
    std::vector<uint32_t> unannounced;
    if (auto cit = channels_.find(id.channel); cit != channels_.end()) {
        Channel& ch = cit->second;
        std::deque<Event> keep;
        for (Event& e : ch.events) {
            if (e.handle == handle) {
                take_byte(ch);
                if (e.resp.event == kConnectRequest) unannounced.push_back(e.resp.id);
            } else {
                keep.push_back(e);
            }
        }
        ch.events.swap(keep);
        ch.ids.erase(handle);
    }
    if (id.deadline_ns) timers_.erase({id.deadline_ns, handle});
    drop_joins(handle);
    if (id.bound) {
        auto pit = ports_.find(PortKey{id.guest, id.ps, id.src.port});
        if (pit != ports_.end()) {
            std::erase(pit->second, handle);
            if (pit->second.empty()) ports_.erase(pit);
        }
    }
    --guest_ids_[id.guest];
    if (id.state == State::Listen) --guest_listens_[id.guest];
    ids_.erase(handle);
    for (uint32_t child : unannounced) drop_id(child);
}

void CmService::peer_lost(Id& id) {
    switch (id.state) {
    case State::Connecting:  // the request timed out
        id.state = State::Closed;
        queue(id, kUnreachable, -ETIMEDOUT, id.uid);
        break;
    case State::ReqReceived:
    case State::RepSent:
    case State::RepReceived:
    case State::Established:
    case State::DreqSent:
        set_state(id, State::Closed);
        queue(id, kDisconnected, 0, id.uid);
        break;
    case State::DreqReceived:
        id.state = State::Closed;
        break;
    default:
        break;
    }
}

// --- the messages received -----------------------------------------------

void CmService::on_req(const CmMsg& m) {
    const bool ud = m.op == uint8_t(CmOp::SidrReq);
    uint64_t here, from;
    if (!guest_by_lid(m.dst_lid, here) || !guest_by_lid(m.src_lid, from)) return;
    Endpoint dst, src;
    dst.ip.family = src.ip.family = m.family;
    std::memcpy(dst.ip.bytes, m.dst_ip, 16);
    std::memcpy(src.ip.bytes, m.src_ip, 16);
    if (m.family == AF_INET) {
        std::memset(dst.ip.bytes + 4, 0, 12);
        std::memset(src.ip.bytes + 4, 0, 12);
    }
    dst.port = ntohs(m.dst_port);
    src.port = ntohs(m.src_port);
    auto answer = [&](CmOp op, int32_t status, bool unreachable) {
        CmMsg r{};
        r.op = uint8_t(op);
        r.src_lid = m.dst_lid;
        r.dst_lid = m.src_lid;
        r.dst_id = m.src_id;
        r.status = status;
        r.unreachable = unreachable;
        deliver(r);
    };
    // The addresses must be the two guests' own (loopback only within one
    // guest): a peer shim cannot put another source in a request, nor reach
    // a listener on loopback.
    if (from != here && (!owns(from, src.ip) || !owns(here, dst.ip))) {
        if (warning_due())
            LOG_WARN("rdma_cm: a request from lid %u as %s to %s, which are not those guests' addresses: refused",
                     m.src_lid, src.ip.str().c_str(), dst.ip.str().c_str());
        return ud ? answer(CmOp::SidrRep, kSidrUnsupported, false) : answer(CmOp::Rej, kRejInvalidServiceId, false);
    }
    Id* l = find_listener(here, m.ps, dst);
    // A connected-mode request for a UD listener, or SIDR for an RC one,
    // finds no service.
    if (l && (l->qp_type == IBV_QPT_UD) != ud) l = nullptr;
    if (!l) return ud ? answer(CmOp::SidrRep, kSidrUnsupported, false) : answer(CmOp::Rej, kRejInvalidServiceId, false);
    auto lch = channels_.find(l->channel);
    // The backlog counts the requests the listener has not read yet, as
    // the kernel's does; past it (or its guest's ids, or its channel's
    // events) a request is dropped, and the sender times out.
    if (lch == channels_.end() || l->pending >= l->backlog || guest_ids_[l->guest] >= kMaxIds ||
        lch->second.events.size() >= kMaxEvents)
        return answer(ud ? CmOp::SidrRep : CmOp::Rej, 0, true);
    ++l->pending;
    Id& p = new_id(lch->second, l->ps, l->qp_type, 0);
    p.peer = m.src_id;
    p.state = State::ReqReceived;
    p.src = dst;
    p.src.port = l->src.port;
    p.dst = src;
    p.dst_known = true;
    p.peer_guest = from;
    p.retry_count = std::min<uint8_t>(m.retry_count, 7);
    p.reuseaddr = l->reuseaddr;
    // Until ACCEPT says otherwise, the passive side serves as many reads as
    // the active side may issue, and issues as many as it serves.
    p.responder_resources = m.initiator_depth;
    p.initiator_depth = m.responder_resources;

    Event& e = queue_event(p, kConnectRequest, 0);
    e.handle = l->handle;  // the listener's event (librdmacm acks it on the listener), about the new id
    e.resp.uid = l->uid;
    if (ud) {
        rdma_ucm_ud_param& u = e.resp.param.ud;
        fill_ah(u.ah_attr, p);
        u.private_data_len = m.private_data_len;
        std::memcpy(u.private_data, m.private_data, m.private_data_len);
    } else {
        p.peer_qp_num = m.qp_num & 0xffffff;
        p.peer_psn = m.psn & 0xffffff;
        conn_of(e.resp.param.conn, m);
        e.resp.ece.vendor_id = m.ece_vendor;
        e.resp.ece.attr_mod = m.ece_attr;
    }
}

void CmService::on_rep(const CmMsg& m) {
    Id* id = target(m);
    if (!id || id->state != State::Connecting || id->qp_type == IBV_QPT_UD) return;
    id->peer = m.src_id;
    id->state = State::RepReceived;
    id->peer_qp_num = m.qp_num & 0xffffff;
    id->peer_psn = m.psn & 0xffffff;
    // The active side may read and write as far as the passive one lets it.
    id->initiator_depth = std::min(id->initiator_depth, m.responder_resources);
    id->responder_resources = std::min(id->responder_resources, m.initiator_depth);
    Event& e = queue_event(*id, kConnectResponse, 0);
    conn_of(e.resp.param.conn, m);
    e.resp.ece.vendor_id = m.ece_vendor;
    e.resp.ece.attr_mod = m.ece_attr;
}

void CmService::on_rtu(const CmMsg& m) {
    Id* id = target(m);
    if (!id || id->state != State::RepSent) return;
    id->state = State::Established;
    queue(*id, kEstablished, 0, id->uid);
}

void CmService::on_rej(const CmMsg& m) {
    Id* id = target(m);
    if (!id) return;
    if (id->state == State::ReqReceived || id->state == State::RepSent) {  // the active side withdrew its request
        id->state = State::Closed;
        queue(*id, kRejected, kRejConsumerDefined, id->uid);
        return;
    }
    if (id->state != State::Connecting) return;
    id->state = State::Closed;
    if (m.unreachable) {
        queue(*id, kUnreachable, -ETIMEDOUT, id->uid);
        return;
    }
    Event& e = queue_event(*id, kRejected, m.status);
    e.resp.param.conn.private_data_len = m.private_data_len;
    std::memcpy(e.resp.param.conn.private_data, m.private_data, m.private_data_len);
}

void CmService::on_dreq(const CmMsg& m) {
    Id* id = target(m);
    if (!id) return;
    switch (id->state) {
    case State::RepSent:
    case State::RepReceived:
    case State::Established:
        id->state = State::DreqReceived;
        queue(*id, kDisconnected, 0, id->uid);
        break;
    case State::DreqSent:  // both sides disconnected at once: each DREQ answers the other
        set_state(*id, State::Closed);
        queue(*id, kDisconnected, 0, id->uid);
        break;
    default:
        break;
    }
}

void CmService::on_drep(const CmMsg& m) {
    Id* id = target(m);
    if (!id || id->state != State::DreqSent) return;
    set_state(*id, State::Closed);
    queue(*id, kDisconnected, 0, id->uid);
}

void CmService::on_sidr_rep(const CmMsg& m) {
    Id* id = target(m);
    if (!id) return;
    if (id->state == State::ReqReceived) {  // the active side withdrew its request
        id->state = State::Closed;
        return;
    }
    if (id->state != State::Connecting || id->qp_type != IBV_QPT_UD) return;
    if (m.status != 0 || m.unreachable) {
        id->state = State::Closed;
        Event& e = queue_event(*id, kUnreachable, m.unreachable ? -ETIMEDOUT : m.status);
        e.resp.param.ud.private_data_len = m.private_data_len;
        std::memcpy(e.resp.param.ud.private_data, m.private_data, m.private_data_len);
        return;
    }
    id->peer = m.src_id;
    id->state = State::Established;
    Event& e = queue_event(*id, kEstablished, 0);
    rdma_ucm_ud_param& u = e.resp.param.ud;
    fill_ah(u.ah_attr, *id);
    u.qp_num = m.qp_num & 0xffffff;
    u.qkey = m.qkey;
    u.private_data_len = m.private_data_len;
    std::memcpy(u.private_data, m.private_data, m.private_data_len);
}

}  // namespace vrdma::shim::cm
