// The UCMA commands as the kernel's rdma_ucm module takes them (include/
// rdma/rdma_user_cm.h): each body is copied out of the message into a
// zeroed struct (a shorter body, from an older librdmacm, leaves the rest
// zero, as the kernel does), checked, and answered with the bytes the
// kernel would write to the command's response pointer.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>

#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>

#include "cm_service.h"
#include "vrdma/abi.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/log.h"

namespace vrdma::shim::cm {
namespace {

template <typename T>
T body_of(const uint8_t* body, size_t in) {
    T t{};
    std::memcpy(&t, body, std::min(in, sizeof(T)));
    return t;
}

// A command's body and what follows it (SET_OPTION's value).
struct Args {
    const uint8_t* body;
    size_t in;
    const uint8_t* extra;
    size_t extra_len;
    template <typename T>
    T get() const { return body_of<T>(body, in); }
};

template <typename T>
void respond(std::vector<uint8_t>& out, const T& resp) {
    out.resize(sizeof(T));
    std::memcpy(out.data(), &resp, sizeof(T));
}

// Two ends of one anonymous pipe (not a FIFO in some file system): a write
// end and a read end.
bool same_pipe(int w, int r) {
    struct stat ws, rs;
    if (::fstat(w, &ws) != 0 || ::fstat(r, &rs) != 0) return false;
    if (!S_ISFIFO(ws.st_mode) || ws.st_ino != rs.st_ino || ws.st_dev != rs.st_dev) return false;
    char path[64], target[64] = {};
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", w);
    if (::readlink(path, target, sizeof(target) - 1) <= 0 || std::strncmp(target, "pipe:[", 6) != 0) return false;
    const int wf = ::fcntl(w, F_GETFL), rf = ::fcntl(r, F_GETFL);
    return wf >= 0 && rf >= 0 && (wf & O_ACCMODE) == O_WRONLY && (rf & O_ACCMODE) == O_RDONLY;
}

// The shim's own open file description of a pipe end the guest passed:
// its O_NONBLOCK is the shim's alone (the guest shares the pipe, not the
// description), so no write or read of the shim's ever blocks.
UniqueFd own_end(int fd, int mode) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    return UniqueFd(::open(path, mode | O_NONBLOCK | O_CLOEXEC));
}

bool send_reply(int sock, int status, const std::vector<uint8_t>& payload, uint32_t channel_id) {
    uint8_t buf[sizeof(abi::CmSockReply) + abi::kCmMaxResponse];
    abi::CmSockReply r{abi::kMagic, status, uint32_t(payload.size()), channel_id};
    std::memcpy(buf, &r, sizeof(r));
    if (!payload.empty()) std::memcpy(buf + sizeof(r), payload.data(), payload.size());
    const size_t n = sizeof(r) + payload.size();
    return ::send(sock, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL) == ssize_t(n);
}

}  // namespace

int CmService::command(uint64_t channel, const uint8_t* cmd, size_t len, std::vector<uint8_t>& out) {
    out.clear();
    auto cit = channels_.find(channel);
    if (cit == channels_.end()) return EBADF;
    Channel& ch = cit->second;
    rdma_ucm_cmd_hdr hdr;
    if (len < sizeof(hdr)) return EINVAL;
    std::memcpy(&hdr, cmd, sizeof(hdr));
    if (sizeof(hdr) + hdr.in > len) return EINVAL;

    // One row per UCMA command, in the kernel's order: the response bytes
    // it needs (refused with ENOSPC before the command acts, as the kernel
    // does: an event taken, an id made or destroyed) and its handler.
    using Handler = int (*)(CmService&, Channel&, const Args&, std::vector<uint8_t>&);
    struct Row {
        uint32_t cmd;
        size_t response;
        Handler run;  // null: not served (ENOSYS)
    };
    // AF_IB (BIND, RESOLVE_ADDR, QUERY) is refused: librdmacm then keeps to
    // the IP commands.
    static constexpr Handler kNoAfIb = [](CmService&, Channel&, const Args&, std::vector<uint8_t>&) {
        return EAFNOSUPPORT;
    };
    static constexpr Row kRows[] = {
        {RDMA_USER_CM_CMD_CREATE_ID, sizeof(rdma_ucm_create_id_resp),
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>& o) {
             return s.create_id(c, a.get<rdma_ucm_create_id>(), o);
         }},
        {RDMA_USER_CM_CMD_DESTROY_ID, sizeof(rdma_ucm_destroy_id_resp),
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>& o) {
             return s.destroy_id(c, a.get<rdma_ucm_destroy_id>().id, o);
         }},
        {RDMA_USER_CM_CMD_BIND_IP, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.bind_ip(c, a.get<rdma_ucm_bind_ip>());
         }},
        {RDMA_USER_CM_CMD_RESOLVE_IP, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.resolve_ip(c, a.get<rdma_ucm_resolve_ip>());
         }},
        {RDMA_USER_CM_CMD_RESOLVE_ROUTE, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.resolve_route(c, a.get<rdma_ucm_resolve_route>());
         }},
        {RDMA_USER_CM_CMD_QUERY_ROUTE, sizeof(rdma_ucm_query_route_resp),
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>& o) {
             return s.query_route(c, a.get<rdma_ucm_query>().id, o);
         }},
        {RDMA_USER_CM_CMD_CONNECT, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.connect(c, a.get<rdma_ucm_connect>());
         }},
        {RDMA_USER_CM_CMD_LISTEN, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.listen(c, a.get<rdma_ucm_listen>());
         }},
        {RDMA_USER_CM_CMD_ACCEPT, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.accept(c, a.get<rdma_ucm_accept>());
         }},
        {RDMA_USER_CM_CMD_REJECT, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.reject(c, a.get<rdma_ucm_reject>());
         }},
        {RDMA_USER_CM_CMD_DISCONNECT, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.disconnect(c, a.get<rdma_ucm_disconnect>().id);
         }},
        {RDMA_USER_CM_CMD_INIT_QP_ATTR, sizeof(ib_uverbs_qp_attr),
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>& o) {
             return s.init_qp_attr(c, a.get<rdma_ucm_init_qp_attr>(), o);
         }},
        // An older librdmacm's event has no ECE: it is cut there.
        {RDMA_USER_CM_CMD_GET_EVENT, offsetof(rdma_ucm_event_resp, reserved),
         [](CmService& s, Channel& c, const Args&, std::vector<uint8_t>& o) { return s.get_event(c, o); }},
        {RDMA_USER_CM_CMD_GET_OPTION, 0, nullptr},  // the kernel has none either
        {RDMA_USER_CM_CMD_SET_OPTION, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.set_option(c, a.get<rdma_ucm_set_option>(), a.extra, a.extra_len);
         }},
        {RDMA_USER_CM_CMD_NOTIFY, 0,
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>&) {
             return s.find(c, a.get<rdma_ucm_notify>().id) ? 0 : ENOENT;
         }},
        {RDMA_USER_CM_CMD_JOIN_IP_MCAST, sizeof(rdma_ucm_create_id_resp),
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>& o) {
             const auto j = a.get<rdma_ucm_join_ip_mcast>();
             return s.join(c, j.id, &j.addr, sizeof(j.addr), j.uid, RDMA_MC_JOIN_FLAG_FULLMEMBER, o);
         }},
        {RDMA_USER_CM_CMD_LEAVE_MCAST, sizeof(rdma_ucm_destroy_id_resp),
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>& o) {
             return s.leave(c, a.get<rdma_ucm_destroy_id>().id, o);
         }},
        {RDMA_USER_CM_CMD_MIGRATE_ID, sizeof(rdma_ucm_migrate_resp),
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>& o) {
             return s.migrate_id(c, a.get<rdma_ucm_migrate_id>(), o);
         }},
        {RDMA_USER_CM_CMD_QUERY, 0, kNoAfIb},
        {RDMA_USER_CM_CMD_BIND, 0, kNoAfIb},
        {RDMA_USER_CM_CMD_RESOLVE_ADDR, 0, kNoAfIb},
        {RDMA_USER_CM_CMD_JOIN_MCAST, sizeof(rdma_ucm_create_id_resp),
         [](CmService& s, Channel& c, const Args& a, std::vector<uint8_t>& o) {
             const auto j = a.get<rdma_ucm_join_mcast>();
             if (j.addr_size > sizeof(j.addr)) return EINVAL;
             return s.join(c, j.id, &j.addr, j.addr_size, j.uid, j.join_flags, o);
         }},
    };
    static_assert([] {
        for (size_t i = 0; i < std::size(kRows); ++i)
            if (kRows[i].cmd != i) return false;
        return true;
    }(), "kRows: one row per UCMA command, in the kernel's order from 0");

    if (hdr.cmd >= std::size(kRows) || !kRows[hdr.cmd].run) return ENOSYS;
    const Row& row = kRows[hdr.cmd];
    if (hdr.out < row.response) return ENOSPC;
    const Args args{cmd + sizeof(hdr), hdr.in, cmd + sizeof(hdr) + hdr.in, len - sizeof(hdr) - hdr.in};
    if (int rc = row.run(*this, ch, args, out)) {
        out.clear();
        return rc;
    }
    if (out.size() > hdr.out) out.resize(hdr.out);  // an event cut at its ECE, for an older librdmacm
    return 0;
}

bool CmService::on_readable(uint64_t channel) {
    auto it = channels_.find(channel);
    if (it == channels_.end()) return false;
    Channel& ch = it->second;
    alignas(8) uint8_t buf[sizeof(abi::CmSockRequest) + abi::kCmMaxCommand];
    std::vector<UniqueFd> fds;
    long n = recv_with_fds(ch.sock.get(), buf, sizeof(buf), fds);
    if (n == -EAGAIN || n == -EWOULDBLOCK) return true;
    if (n <= 0) return false;
    abi::CmSockRequest req;
    std::vector<uint8_t> out;
    if (size_t(n) < sizeof(req)) return send_reply(ch.sock.get(), EINVAL, out, 0), false;
    std::memcpy(&req, buf, sizeof(req));
    if (req.magic != abi::kMagic || req.version != abi::kVersion || req.len != size_t(n) - sizeof(req))
        return send_reply(ch.sock.get(), EPROTO, out, 0), false;
    if (req.op == abi::CmSockOp::Open) {
        if (ch.pipe_w || fds.size() != 2 || !same_pipe(fds[0].get(), fds[1].get()))
            return send_reply(ch.sock.get(), EINVAL, out, 0), false;
        ch.pipe_w = own_end(fds[0].get(), O_WRONLY);
        ch.pipe_r = own_end(fds[1].get(), O_RDONLY);
        if (!ch.pipe_w || !ch.pipe_r) return send_reply(ch.sock.get(), EMFILE, out, 0), false;
        return send_reply(ch.sock.get(), 0, out, uint32_t(ch.id));
    }
    if (req.op != abi::CmSockOp::Command || !ch.pipe_w || !fds.empty())
        return send_reply(ch.sock.get(), EINVAL, out, 0), false;
    const int rc = command(channel, buf + sizeof(req), req.len, out);
    // The command may have closed channels (MIGRATE_ID never does; a
    // destroy does not): `ch` is still this one.
    return send_reply(ch.sock.get(), rc, out, 0);
}

int CmService::create_id(Channel& ch, const rdma_ucm_create_id& c, std::vector<uint8_t>& out) {
    // The kernel's pairs (ucma_get_qp_type): TCP is RC, UDP and IPoIB are
    // UD, IB is RC, UC or UD.
    switch (c.ps) {
    case RDMA_PS_TCP:
        if (c.qp_type != IBV_QPT_RC) return EINVAL;
        break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
        if (c.qp_type != IBV_QPT_UD) return EINVAL;
        break;
    case RDMA_PS_IB:
        if (c.qp_type != IBV_QPT_RC && c.qp_type != IBV_QPT_UC && c.qp_type != IBV_QPT_UD) return EINVAL;
        break;
    default:
        return EINVAL;
    }
    if (guest_ids_[ch.guest] >= kMaxIds) return ENOMEM;
    Id& id = new_id(ch, c.ps, c.qp_type, c.uid);
    rdma_ucm_create_id_resp resp{};
    resp.id = id.handle;
    respond(out, resp);
    return 0;
}

int CmService::destroy_id(Channel& ch, uint32_t handle, std::vector<uint8_t>& out) {
    Id* id = find(ch, handle);
    if (!id) return ENOENT;
    rdma_ucm_destroy_id_resp resp{};
    resp.events_reported = id->events_reported;
    drop_id(handle);
    respond(out, resp);
    return 0;
}

int CmService::bind_ip(Channel& ch, const rdma_ucm_bind_ip& c) {
    Id* id = find(ch, c.id);
    if (!id) return ENOENT;
    Endpoint at;
    if (!endpoint_from_sockaddr(&c.addr, sizeof(c.addr), at)) return EAFNOSUPPORT;
    if (id->state != State::Idle) return EINVAL;
    return bind(*id, at);
}

int CmService::query_route(Channel& ch, uint32_t handle, std::vector<uint8_t>& out) {
    Id* id = find(ch, handle);
    if (!id) return ENOENT;
    rdma_ucm_query_route_resp resp{};
    // A device is known once the id has an address of its guest (the
    // wildcard has none, as in the kernel).
    if (id->src.ip.family != AF_UNSPEC && !id->src.ip.is_any()) {
        resp.node_guid = htobe64(guests_.at(id->guest).guid);
        resp.port_num = 1;
        resp.ibdev_index = 0xffffffff;  // librdmacm then matches the device by GUID
        gid_of(id->guest, resp.ib_route[0].sgid);
        if (id->dst_known) gid_of(id->peer_guest, resp.ib_route[0].dgid);
        resp.ib_route[0].pkey = htobe16(guests_.at(id->guest).pkey);
    }
    if (id->dst_known && id->state != State::AddrResolved && id->state != State::Bound) {
        fill_path(resp.ib_route[0], *id);
        resp.num_paths = 1;
    }
    endpoint_to_sockaddr(id->src, &resp.src_addr, sizeof(resp.src_addr));
    if (id->dst_known) endpoint_to_sockaddr(id->dst, &resp.dst_addr, sizeof(resp.dst_addr));
    respond(out, resp);
    return 0;
}

int CmService::init_qp_attr(Channel& ch, const rdma_ucm_init_qp_attr& c, std::vector<uint8_t>& out) {
    Id* id = find(ch, c.id);
    if (!id) return ENOENT;
    ib_uverbs_qp_attr a{};
    a.qp_state = c.qp_state;
    const bool connected = id->peer_qp_num != 0;
    switch (c.qp_state) {
    case IBV_QPS_INIT:
        a.qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
        a.port_num = 1;
        a.pkey_index = 0;
        if (id->qp_type == IBV_QPT_UD) {
            a.qkey = id->qkey;
            a.qp_attr_mask |= IBV_QP_QKEY;
        } else {
            // Remote access is granted once a connection gives a peer.
            if (connected)
                a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
                                    (id->responder_resources ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0);
            a.qp_attr_mask |= IBV_QP_ACCESS_FLAGS;
        }
        break;
    case IBV_QPS_RTR:
        if (id->qp_type == IBV_QPT_UD) {
            a.qp_attr_mask = IBV_QP_STATE;
            break;
        }
        if (!connected) return EINVAL;
        a.qp_attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        fill_ah(a.ah_attr, *id);
        a.path_mtu = IBV_MTU_4096;
        a.dest_qp_num = id->peer_qp_num;
        a.rq_psn = id->peer_psn;
        a.max_dest_rd_atomic = id->responder_resources;
        a.min_rnr_timer = 12;
        if (id->qp_type == IBV_QPT_UC)
            a.qp_attr_mask &= ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        break;
    case IBV_QPS_RTS:
        a.qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        a.sq_psn = id->psn;
        if (id->qp_type == IBV_QPT_RC) {
            if (!connected) return EINVAL;
            a.qp_attr_mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
            a.timeout = id->ack_timeout;
            a.retry_cnt = id->retry_count;
            a.rnr_retry = id->rnr_retry_count;
            a.max_rd_atomic = id->initiator_depth;
        }
        break;
    default:
        return EINVAL;
    }
    respond(out, a);
    return 0;
}

int CmService::get_event(Channel& ch, std::vector<uint8_t>& out) {
    if (ch.events.empty()) return EAGAIN;  // its count was taken back (the id went): the provider waits again
    Event e = ch.events.front();
    ch.events.pop_front();
    if (e.join)
        if (auto j = joins_.find(e.join); j != joins_.end()) ++j->second.events_reported;
    if (Id* id = id_of(e.handle)) {
        ++id->events_reported;
        if (e.resp.event == kConnectRequest && id->pending) --id->pending;  // room in its backlog
    }
    respond(out, e.resp);
    return 0;
}

int CmService::set_option(Channel& ch, const rdma_ucm_set_option& c, const uint8_t* value, size_t len) {
    Id* id = find(ch, c.id);
    if (!id) return ENOENT;
    if (c.optlen != len) return EINVAL;
    auto int_value = [&](int& v) {
        if (len != sizeof(int)) return false;
        std::memcpy(&v, value, sizeof(int));
        return true;
    };
    int v = 0;
    if (c.level == RDMA_OPTION_ID) {
        switch (c.optname) {
        case RDMA_OPTION_ID_TOS:
            return len == 1 ? 0 : EINVAL;  // one traffic class: accepted and ignored
        case RDMA_OPTION_ID_REUSEADDR:
            if (!int_value(v)) return EINVAL;
            if (id->state != State::Idle) return EINVAL;
            id->reuseaddr = v != 0;
            return 0;
        case RDMA_OPTION_ID_AFONLY:
            if (!int_value(v)) return EINVAL;
            if (id->state != State::Idle) return EINVAL;
            id->afonly = v != 0;
            return 0;
        case RDMA_OPTION_ID_ACK_TIMEOUT:
            if (len != 1 || value[0] > 31) return EINVAL;
            id->ack_timeout = value[0];
            return 0;
        default:
            return ENOSYS;
        }
    }
    if (c.level == RDMA_OPTION_IB && c.optname == RDMA_OPTION_IB_PATH)
        return EINVAL;  // the shim knows the path: rdma_resolve_route asks it instead
    return ENOSYS;
}

int CmService::migrate_id(Channel& ch, const rdma_ucm_migrate_id& c, std::vector<uint8_t>& out) {
    // Sent on the target channel; `fd` names the channel the id is on.
    auto from = channels_.find(c.fd);
    if (from == channels_.end() || from->second.guest != ch.guest) return EBADF;
    Id* id = find(from->second, c.id);
    if (!id) return ENOENT;
    if (&from->second != &ch) {
        std::deque<Event> keep;
        for (Event& e : from->second.events) {
            if (e.handle != c.id) {
                keep.push_back(e);
                continue;
            }
            take_byte(from->second);
            ch.events.push_back(e);
            put_byte(ch);
        }
        from->second.events.swap(keep);
        from->second.ids.erase(c.id);
        ch.ids.insert(c.id);
        id->channel = ch.id;
    }
    rdma_ucm_migrate_resp resp{};
    resp.events_reported = id->events_reported;
    respond(out, resp);
    return 0;
}

}  // namespace vrdma::shim::cm
