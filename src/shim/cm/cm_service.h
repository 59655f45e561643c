// The connection manager behind rdma_cm (docs/protocol.md "rdma_cm").
//
// librdmacm drives the kernel's UCMA device by write()ing commands to it;
// the provider forwards each one, unchanged, over the guest's rdma_cm.sock
// to this service, which plays the kernel's part: CM ids, bound addresses
// and ports, address and route resolution from the guests' IP addresses
// (--guest NAME:ip=..., and the addresses peer shims announce for theirs),
// and the CM exchange between two ids: REQ, REP, RTU, REJ, DREQ, DREP, and
// SIDR for UD (cm_wire.h), handed over in place between guests of this
// shim and sent over the fabric (through the outbox) to a peer shim's.
// Events are queued per channel (one open() of the device) and counted, a
// byte each, in the channel's pipe, whose read end is the fd librdmacm
// polls.
//
// It runs in the daemon's thread (the control plane) and never touches a
// guest's memory: every command arrives in a socket message, every peer's
// message in a fabric segment, and each is copied and checked. A guest
// reaches only its own channels and ids, binds only its own addresses, and
// is held to kMaxChannels, kMaxIds, kMaxListens, kMaxJoins and kMaxEvents.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <infiniband/verbs.h>
#include <rdma/rdma_user_cm.h>

#include "cm_wire.h"
#include "ip_address.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim::cm {

// The events of rdma_cm(7), numbered as the kernel reports them (librdmacm's
// enum rdma_cm_event_type; the shim does not need librdmacm's headers).
enum CmEvent : uint32_t {
    kAddrResolved = 0, kAddrError = 1, kRouteResolved = 2, kRouteError = 3,
    kConnectRequest = 4, kConnectResponse = 5, kConnectError = 6, kUnreachable = 7,
    kRejected = 8, kEstablished = 9, kDisconnected = 10, kDeviceRemoval = 11,
    kMulticastJoin = 12, kMulticastError = 13,
};

// What the CM knows of a guest: one of this shim's, or of a peer shim's
// (remote: what that shim announced, reached through the peer whose LID
// range starts at peer_first).
struct CmGuest {
    std::string name;
    uint16_t lid = 0;
    uint64_t guid = 0;  // host order; the GID is fe80::GUID
    uint16_t pkey = 0xffff;
    std::vector<IpAddress> addrs;
    bool remote = false;
    uint16_t peer_first = 0;
};

class CmService {
public:
    static constexpr uint32_t kMaxChannels = 64;     // per guest: open()s of rdma_cm
    static constexpr uint32_t kMaxIds = 4096;        // per guest
    static constexpr uint32_t kMaxEvents = 16384;    // queued per channel
    static constexpr uint32_t kMaxJoins = 1024;      // per guest: multicast joins of its ids
    static constexpr uint32_t kMaxListens = 256;     // per guest: ids listening

    // Guest `index` (the daemon's) is served, or is no longer: its
    // channels close, and the peers of its ids see them go.
    void set_guest(size_t index, CmGuest g);
    void remove_guest(size_t index);

    // The fabric (worker 0's links to each peer shim's worker 0): `send`
    // carries a CM message from guest LID `src_lid` to the peer whose LID
    // range starts at `peer_first`.
    using Outbox = std::function<void(uint16_t peer_first, uint16_t src_lid, const uint8_t* msg, size_t len)>;
    void set_outbox(Outbox send) { outbox_ = std::move(send); }
    // A peer shim (LIDs first..last) came up: it learns this shim's
    // guests' addresses. Gone: its guests' addresses go, and ids connected
    // to them are told as by a lost connection.
    void peer_up(uint16_t first, uint16_t last);
    void peer_down(uint16_t first, uint16_t last);
    // A message from that peer's guest `src_lid` (its link checked that
    // the LID is the peer's); checked here like any peer input, and
    // dropped if wrong.
    void from_peer(uint16_t first, uint16_t last, uint16_t src_lid, const uint8_t* msg, size_t len);
    // A message the outbox could not send (the peer is down, or the
    // guest's queue to it is full): its sender is told as of a timeout.
    void undeliverable(const uint8_t* msg, size_t len);

    // Timeouts (a DREQ the peer never answers): the earliest deadline
    // (monotonic ns, 0: none), and what is due at `now_ns`.
    static constexpr uint64_t kDreqTimeoutNs = 3'000'000'000;
    uint64_t next_deadline_ns() const { return timers_.empty() ? 0 : timers_.begin()->first; }
    void on_timer(uint64_t now_ns);

    // A connection accepted on guest `index`'s rdma_cm.sock. Returns its
    // channel id (the daemon watches `sock` under it), or 0 when the guest
    // holds kMaxChannels (the socket is closed).
    uint64_t add_connection(size_t index, UniqueFd sock);
    int socket_of(uint64_t channel) const;
    // Reads and answers one message. False: close the channel.
    bool on_readable(uint64_t channel);
    void close_channel(uint64_t channel);
    size_t channel_count() const { return channels_.size(); }
    size_t id_count() const { return ids_.size(); }
    size_t join_count() const { return joins_.size(); }

    // One UCMA command (header and body, `extra` bytes of SET_OPTION's
    // value after it) on `channel`: the response bytes for the command's
    // response pointer, or a positive errno. Public for the fuzz target.
    int command(uint64_t channel, const uint8_t* cmd, size_t len, std::vector<uint8_t>& response);

private:
    enum class State {
        Idle, Bound, AddrResolved, RouteResolved, Listen,
        Connecting,   // active: REQ (or SIDR REQ) sent
        ReqReceived,  // passive: a connection request not yet answered
        RepSent,      // passive: accepted, waiting for the RTU
        RepReceived,  // active: accepted by the peer, its RTU (ACCEPT) not yet sent
        Established,
        DreqSent,     // disconnected here, waiting for the peer's DREP
        DreqReceived, // the peer disconnected; our DREP is owed
        Closed,       // rejected, unreachable or disconnected: only destroy remains
    };
    struct Id {
        uint32_t handle = 0;
        uint64_t uid = 0;
        uint64_t channel = 0;
        uint64_t guest = 0;        // a key of guests_ (always this shim's)
        uint16_t ps = 0;
        uint8_t qp_type = 0;
        State state = State::Idle;
        Endpoint src, dst;
        bool bound = false;        // holds src.port in its guest's port space
        bool reuseaddr = false;
        bool afonly = false;
        bool dst_known = false;    // dst resolved to peer_guest
        uint64_t peer_guest = 0;   // a key of guests_
        uint32_t peer = 0;         // the id at the other end, on its guest's shim (0: not known yet)
        uint32_t backlog = 0, pending = 0;  // Listen: pending = its CONNECT_REQUESTs not read yet
        uint32_t qp_num = 0, psn = 0, qkey = 0;
        uint32_t peer_qp_num = 0, peer_psn = 0;
        uint8_t responder_resources = 0, initiator_depth = 0;
        uint8_t retry_count = 7, rnr_retry_count = 7, srq = 0;
        uint8_t ack_timeout = 14;  // RTS's timeout (RDMA_OPTION_ID_ACK_TIMEOUT)
        uint32_t events_reported = 0;
        uint64_t deadline_ns = 0;  // DreqSent: when the DREP is given up on (in timers_)
        std::vector<uint32_t> joins;  // its multicast joins (keys of joins_)
    };
    struct Event {
        uint32_t handle;  // the id it is about (dropped with it)
        uint32_t join = 0;  // a multicast join's event: the join (dropped with it)
        rdma_ucm_event_resp resp;
    };
    // A multicast join of an id (rdma_join_multicast): the group it named.
    // The data path's membership is the QP's (ibv_attach_mcast, which
    // librdmacm calls on the join's event).
    struct Join {
        uint32_t handle = 0;
        uint32_t id = 0;
        uint64_t guest = 0;
        uint64_t uid = 0;
        uint8_t mgid[16] = {};
        uint32_t events_reported = 0;
    };
    struct Channel {
        uint64_t id = 0;
        uint64_t guest = 0;
        UniqueFd sock;
        // The shim's own descriptions of the two ends of the guest's pipe
        // (nonblocking whatever the guest does to its own): a byte per
        // event queued, taken back when an event goes unread.
        UniqueFd pipe_w;
        UniqueFd pipe_r;
        std::deque<Event> events;
        std::set<uint32_t> ids;
    };
    struct PortKey {
        uint64_t guest;
        uint16_t ps;
        uint16_t port;
        auto operator<=>(const PortKey&) const = default;
    };

    // Commands (ucma_commands.cpp), each with its body copied out.
    int create_id(Channel& ch, const rdma_ucm_create_id& c, std::vector<uint8_t>& out);
    int destroy_id(Channel& ch, uint32_t handle, std::vector<uint8_t>& out);
    int bind_ip(Channel& ch, const rdma_ucm_bind_ip& c);
    int resolve_ip(Channel& ch, const rdma_ucm_resolve_ip& c);
    int resolve_route(Channel& ch, const rdma_ucm_resolve_route& c);
    int query_route(Channel& ch, uint32_t handle, std::vector<uint8_t>& out);
    int connect(Channel& ch, const rdma_ucm_connect& c);
    int listen(Channel& ch, const rdma_ucm_listen& c);
    int accept(Channel& ch, const rdma_ucm_accept& c);
    int reject(Channel& ch, const rdma_ucm_reject& c);
    int disconnect(Channel& ch, uint32_t handle);
    int init_qp_attr(Channel& ch, const rdma_ucm_init_qp_attr& c, std::vector<uint8_t>& out);
    int get_event(Channel& ch, std::vector<uint8_t>& out);
    int set_option(Channel& ch, const rdma_ucm_set_option& c, const uint8_t* value, size_t len);
    int migrate_id(Channel& ch, const rdma_ucm_migrate_id& c, std::vector<uint8_t>& out);
    // Multicast (cm_multicast.cpp).
    int join(Channel& ch, uint32_t id, const void* addr, size_t addr_len, uint64_t uid, uint32_t flags,
             std::vector<uint8_t>& out);
    int leave(Channel& ch, uint32_t join, std::vector<uint8_t>& out);
    void drop_joins(uint32_t id);  // the id goes: its joins with it

    // Ids, ports and addresses (cm_service.cpp).
    Id* find(const Channel& ch, uint32_t handle);
    Id* id_of(uint32_t handle);
    Id& new_id(Channel& ch, uint16_t ps, uint8_t qp_type, uint64_t uid);
    void drop_id(uint32_t handle);  // what a destroy sends the peer, then gone
    int bind(Id& id, const Endpoint& at);
    bool owns(uint64_t guest, const IpAddress& ip) const;
    // The guest whose address `ip` is (loopback and wildcard: `self`).
    bool guest_of(const IpAddress& ip, uint64_t self, uint64_t& out) const;
    bool guest_by_lid(uint16_t lid, uint64_t& out) const;
    Id* find_listener(uint64_t guest, uint16_t ps, const Endpoint& dst);
    void queue(Id& id, uint32_t event, int32_t status, uint64_t uid);
    Event& queue_event(Id& id, uint32_t event, int32_t status);
    void fill_ah(ib_uverbs_ah_attr& ah, const Id& to) const;
    void fill_path(ib_user_path_rec& p, const Id& id) const;
    void gid_of(uint64_t guest, uint8_t gid[16]) const;
    void close_channel_ids(Channel& ch);
    static void put_byte(Channel& ch);
    static void take_byte(Channel& ch);
    // The peer's side is gone (its shim or guest): the id is told as the
    // kernel tells it of a connection that timed out.
    void peer_lost(Id& id);
    void announce(uint64_t guest, bool gone);  // to every peer shim that is up

    // The exchange (cm_exchange.cpp): a message from an id, delivered in
    // place to an id of this shim or sent to the peer shim of its guest.
    CmMsg message(const Id& from, CmOp op) const;
    void deliver(const CmMsg& m);
    void receive(const CmMsg& m);
    // The id `m` is for: its dst_id, of guest dst_lid, whose peer is the
    // sender (null: none such; a stale or forged message is dropped).
    Id* target(const CmMsg& m);
    void on_req(const CmMsg& m);
    void on_rep(const CmMsg& m);
    void on_rtu(const CmMsg& m);
    void on_rej(const CmMsg& m);
    void on_dreq(const CmMsg& m);
    void on_drep(const CmMsg& m);
    void on_sidr_rep(const CmMsg& m);
    void on_addresses(uint16_t first, uint16_t last, const CmAddressMsg& a);

    // Keys: the daemon's guest index for this shim's guests, kRemoteKey
    // plus the LID for a peer shim's.
    static constexpr uint64_t kRemoteKey = 1ull << 32;
    std::map<uint64_t, CmGuest> guests_;
    std::map<uint64_t, uint32_t> guest_channels_, guest_ids_, guest_listens_;
    std::set<std::pair<uint16_t, uint16_t>> peers_;  // LID ranges of peer shims that are up
    Outbox outbox_;
    std::set<std::pair<uint64_t, uint32_t>> timers_;  // (deadline, id)
    uint64_t last_warning_ns_ = 0;
    bool warning_due();  // at most one warning a second, whoever causes them
    void set_state(Id& id, State s);  // DreqSent arms its timer, leaving it disarms it
    std::map<uint64_t, Channel> channels_;
    std::map<uint32_t, Id> ids_;
    std::map<uint32_t, Join> joins_;
    std::map<uint64_t, uint32_t> guest_joins_;
    uint32_t next_join_ = 1;
    std::map<PortKey, std::vector<uint32_t>> ports_;  // bound ids by guest, port space and port
    uint64_t next_channel_ = 1;
    uint32_t next_handle_ = 1;
    uint16_t next_ephemeral_ = 0;
};

}  // namespace vrdma::shim::cm
