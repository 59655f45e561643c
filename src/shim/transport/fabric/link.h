// One TCP connection to a peer shim: the TLS handshake and the Hellos, then
// segments both ways (wire.h), every byte through the secure channel
// (tls_channel.h). Non-blocking in every direction:
//   - outgoing messages wait in per-QP queues (bounded: a full queue is
//     back-pressure for that QP only) and leave round-robin, one segment of
//     at most 64 KiB per QP per turn; large payload pieces are handed to the
//     channel straight from the guests' memory, headers and small pieces
//     are gathered into one staging buffer first (one record, not one per
//     32-byte header), and so is memory the guest may truncate (copied
//     under the fault guard: OpenSSL must never touch a vanished page);
//   - incoming segments are parsed from a receive buffer; a payload's bytes
//     that arrived with its header are copied from there into the target
//     memory, the rest is read from the channel straight into it.
// Requests reach the responder (responder.h) of this shim; responses reach
// the requester (requester.h).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "device_model.h"
#include "flat_map.h"
#include "frame_channel.h"
#include "request.h"
#include "responder.h"
#include "tls_channel.h"
#include "vrdma/abi.h"
#include "vrdma_common/unique_fd.h"
#include "wire.h"

namespace vrdma::shim {
class Engine;
class Transport;
}

namespace vrdma::shim::fabric {

struct LinkStats {
    uint64_t tx_bytes = 0, rx_bytes = 0;
    // Of those, the guests' payload (what the shim's CPU copies: written
    // from and read into guest memory by the socket calls).
    uint64_t tx_payload = 0, rx_payload = 0;
    uint64_t tx_msgs = 0, rx_msgs = 0;
    uint64_t retries = 0;  // requests this shim sent again (RNR, timeouts)
    uint64_t errors = 0;   // malformed or misrouted input, NAKs sent
    uint64_t foreign_lid = 0;   // requests claiming a source LID the peer does not own (dropped)
    uint64_t foreign_pkey = 0;  // requests with a P_Key the source guest is not a member of (dropped)
};

// A message waiting to leave: its fixed part and where its payload is.
struct OutMsg {
    SegType type = SegType::Request;
    uint16_t src_lid = 0, dst_lid = 0;
    uint32_t src_qpn = 0, dst_qpn = 0, psn = 0;
    alignas(8) uint8_t fixed[kMaxFixed];
    uint16_t fixed_len = 0;
    Span spans[abi::kMaxSge];
    uint32_t nspans = 0;
    uint64_t total = 0;  // payload bytes
    uint64_t sent = 0;   // payload bytes placed in batches so far
    bool header_sent = false;
    bool plain_ack = false;  // a Response ACK of a SEND or WRITE: later ones may fold into it
    // The payload is memory its guest may truncate (Pins::fragile): the
    // message ends with an empty segment, which says whether a page was lost
    // while writing it (faulted: the rest went as zeros; kSegAbort).
    bool fragile = false;
    bool faulted = false;
    // A UD or UC request: its WQE (send queue index sq_idx) completes once
    // the message is written (requester_sent), or when the link closes (a
    // lost datagram or UC message still completes at the sender).
    bool notify_sent = false;
    uint32_t sq_idx = 0;
    uint64_t notice = 0;  // SegType::UdQp: the guest's port GUID (sent as the offset)
    Pins pins;
    alignas(16) uint8_t inline_data[abi::kMaxInline];
    // A multicast datagram larger than inline_data (up to the port MTU):
    // made the first time this slot carries one, and kept for the next.
    std::unique_ptr<uint8_t[]> large;
    uint8_t* payload_room(uint64_t bytes) {
        if (bytes <= sizeof(inline_data)) return inline_data;
        if (!large) large = std::make_unique<uint8_t[]>(kPortMtuBytes);
        return large.get();
    }
};

// The outgoing queue of one local QP (as requester and as responder).
struct QpSender {
    // 64 messages (about 140 KiB with their inline bytes and scatter
    // lists, only while the QP has output): a stream of small writes goes
    // out many to a batch (before TLS, one writev: 16 measured 0.76 M
    // 64-byte writes/s across the fabric, 64 measured 1.0 M/s; now up to
    // 16 KiB of them share one record).
    static constexpr uint32_t kDepth = 64;
    uint64_t key = 0;
    OutMsg msgs[kDepth];
    uint32_t head = 0, count = 0;
    uint32_t committed = 0;    // head messages whose last bytes are in the batch being written
    bool in_rr = false;        // in the round-robin list of the writer
    bool ack_delayed = false;  // in the link's list of delayed ACKs (Link::delay_ack)
    uint64_t wake_ctx = 0;     // a context that found the queue full
    OutMsg& at(uint32_t i) { return msgs[(head + i) % kDepth]; }
};

enum class LinkState { Handshake, Up, Closed };

// What a link says of its shim in its Hello (wire.h), and how it starts.
struct LinkIdentity {
    InstanceId instance{};
    uint16_t lid_first = 0, lid_last = 0;  // the range this shim owns
    uint16_t listen_port = 0;
    uint8_t workers = 1;                   // of this shim
    uint8_t worker = 0, target = 0;        // dialer: its worker, the one it wants; listener: kAnyWorker
    // Stop after the peer's Hello until release(): the fabric may hand the
    // link to another worker first (fabric.h), and no segment may be read
    // into the wrong engine.
    bool hold = false;
    uint64_t ack_delay_ns = 0;  // set_ack_delay
};

class Link {
public:
    // `dialed`: this shim opened the connection (the TLS client).
    // `lid_first`..`lid_last`: the range this shim owns, announced in the Hello.
    Link(Engine& eng, const TlsContext& tls, UniqueFd fd, bool dialed, const LinkIdentity& me, std::string remote);
    Link(Engine& eng, const TlsContext& tls, UniqueFd fd, bool dialed, const InstanceId& instance,
         uint16_t lid_first, uint16_t lid_last, uint16_t listen_port, std::string remote);
    ~Link();

    // A held link (LinkIdentity::hold) whose Hellos are through: `eng` is
    // the engine of the worker that owns it from now on (the thread that
    // calls this and every later member), `routes_to` the transport that
    // the LIDs of the peer's guests are routed to as their partition
    // announcements arrive (null: none). Sends this worker's guests'
    // partitions and starts reading segments.
    void release(Engine& eng, Transport* routes_to);

    int fd() const { return fd_.get(); }
    LinkState state() const { return state_; }
    bool dialed() const { return dialed_; }
    const std::string& remote() const { return remote_; }
    const Hello& peer_hello() const { return peer_; }
    const std::string& close_reason() const { return close_reason_; }
    // The TLS handshake failed: the peer does not know the fabric key, or
    // someone between changed or replayed its bytes.
    bool auth_failed() const { return auth_failed_; }
    // A record or frame failed its authentication after the handshake.
    bool tampered() const { return tampered_; }
    // The peer's Hello asked for the other --fabric-crypto mode.
    bool mode_mismatch() const { return mode_mismatch_; }
    // Decrypted input waits in the channel (epoll will not report it).
    bool input_buffered() const;
    // When bytes last arrived from the peer (monotonic ns).
    uint64_t last_rx_ns() const { return last_rx_ns_; }
    LinkStats stats;

    // Reads and handles what the socket has (bounded work per call).
    void on_readable();
    // Writes what is queued. True if bytes remain queued (wait for EPOLLOUT).
    bool flush();
    bool wants_write() const;
    // The epoll events the fabric last registered for this link's socket
    // (changed only when they differ: an epoll_ctl per write is costly).
    uint32_t watched_events = 0;
    // Whether the handshake just finished (cleared by the call).
    bool take_became_up();

    // Delayed ACKs. A plain ACK (of a SEND or WRITE) waits up to `ns` for
    // other output to the peer and leaves with it, in the same frame and
    // system call: in a ping-pong the answer carries the ACK of the
    // question, one write and one read less per message on each side. It
    // leaves on its own when the time is up or when it acknowledges
    // kAckDelayMaxMessages messages (a requester's window is not held
    // shut). 0: every ACK leaves in the pass that made it.
    void set_ack_delay(uint64_t ns) { ack_delay_ns_ = ns; }
    static constexpr uint32_t kAckDelayMaxMessages = 16;
    // When the delayed ACKs are due (0: none waits).
    uint64_t ack_due_ns() const { return ack_due_ns_; }
    // Queues the delayed ACKs for writing if they are due at `now`.
    void release_due_acks(uint64_t now) {
        if (ack_due_ns_ && now >= ack_due_ns_) release_acks();
    }

    // Queues a request of local QP (slid, sqpn). False: that QP's queue is
    // full (its context is rescanned when room frees). `inline_payload`:
    // copy the payload (it lives in the requester's scratch memory);
    // otherwise it is written from `local`, kept alive by `pins`.
    bool send_request(const Request& req, uint64_t ctx_id, const Span* local, uint32_t nlocal, bool inline_payload,
                      Pins* pins);

    // Tells the peer that local QP (lid, qpn), connected to its QP
    // (peer_lid, peer_qpn), vanished.
    void send_qp_gone(uint16_t lid, uint32_t qpn, uint16_t peer_lid, uint32_t peer_qpn);
    // Tells the peer that local QP (lid, qpn) is a UD QP on this shim's
    // device, of the guest with port GUID `guid`.
    void send_ud_qp(uint16_t lid, uint32_t qpn, uint64_t guid);
    // The peer's UD QPs on its device, by QPN, as it announced them (at
    // most kMaxUdOwners: more is a protocol violation).
    struct UdOwner {
        uint16_t lid = 0;
        uint64_t guid = 0;
    };
    static constexpr size_t kMaxUdOwners = 1u << 20;
    std::unordered_map<uint32_t, UdOwner> ud_owners;

    // Refuses the peer (a misconfiguration found after the handshake):
    // sends the reason and closes once it is written.
    void refuse(const std::string& reason);
    void close(const std::string& reason);
    // Writes bytes through the channel as they are, outside the segment
    // framing (the tests and the fuzz harness play a hostile but
    // authenticated peer with it). Returns the bytes taken.
    size_t write_unframed(const void* p, size_t n);
    // The LIDs the peer announced: requests from other source LIDs are
    // dropped and counted (stats.foreign_lid), other segments from them are
    // a protocol violation.
    bool peer_owns(uint16_t lid) const { return lid >= peer_.lid_first && lid <= peer_.lid_last; }
    // Whether the peer's guest at `lid` is a member of the partition of
    // `pkey` (as a full member if `pkey` says full), by the P_Key table the
    // peer announced for it (none announced: the default partition only).
    bool peer_member(uint16_t lid, uint16_t pkey) const;
    // Sends a message of the connection manager from this shim's guest at
    // `lid` (at most kMaxCmPayload bytes). False: not sent (the link is not
    // up, or that guest's queue is full).
    bool send_cm(uint16_t lid, const uint8_t* msg, size_t len);
    // Sends multicast datagram `req` (payload req.length bytes at
    // `payload`, copied now) for the peer worker's members of its group.
    // False: not sent (the link is not up, or the sending QP's queue is
    // full: the datagram is lost, as UD allows).
    bool send_multicast(const Request& req, const uint8_t* payload);
    // Where the CM messages the peer sends go (unset: dropped): the
    // sending guest's LID (one the peer owns) and the bytes.
    std::function<void(uint16_t src_lid, const uint8_t* msg, size_t len)> on_cm;
    // Announces the P_Key table of this shim's guest at `lid` (at most
    // kMaxPkeys entries are sent).
    void send_partitions(uint16_t lid, const std::vector<uint16_t>& pkeys);

private:
    enum class RxState { Hello, Header, Fixed, Payload };
    struct InMsg;

    bool fill_buffer();
    // Drives the TLS handshake; true once it is done.
    bool drive_handshake();
    // Through the channel: >0 bytes, 0 not now, -1 the link closed.
    ssize_t send_bytes(const void* p, size_t n);
    ssize_t recv_bytes(void* p, size_t n);
    void fill_stage();
    // Hands the queued output to the channel: up to 64 rounds of writes.
    void write_batches();
    // Sends what the sending channel holds back (as flush_output; -1 also
    // closes the link).
    int flush_channel();
    bool on_hello();
    void announce_guests();
    bool start_frames();
    bool parse();
    bool on_header();
    bool on_fixed();
    bool on_payload_done();
    bool violation(const char* why);
    // A UD or UC request left (or will never leave): its WQE may complete.
    void notify_sent(OutMsg& m);
    void begin_request(InMsg& m);
    void begin_multicast(InMsg& m, const Request& req);
    void finish_request(InMsg& m);
    void begin_response(InMsg& m, const Response& resp, uint64_t length);
    void finish_response(InMsg& m);
    InMsg* find_inbound(uint8_t type, uint16_t lid, uint32_t qpn);
    InMsg* new_inbound();
    void release_inbound(InMsg* m);
    QpSender* sender(uint16_t lid, uint32_t qpn, bool create);
    // The next free message of `s`, addressed, with nothing else in it;
    // null if the queue is full. commit() queues it.
    OutMsg* reserve(QpSender& s, SegType type, uint16_t src_lid, uint32_t src_qpn, uint16_t dst_lid, uint32_t dst_qpn,
                    uint32_t psn);
    void commit(QpSender& s);
    // As commit(), for a plain ACK: it waits (set_ack_delay) unless the
    // queue is being written anyway.
    void delay_ack(QpSender& s);
    // The delayed ACKs join the output (round robin).
    void release_acks();
    void queue_response(uint16_t src_lid, uint32_t src_qpn, uint16_t dst_lid, uint32_t dst_qpn,
                        const Response& resp, bool plain_ack, Delivery* read_from, Pins* pins);
    void build_batch();
    void batch_done();
    bool write_fault();
    void target_fault();
    void send_raw(const void* p, size_t n);

    Engine* eng_;
    Transport* routes_to_ = nullptr;
    bool held_ = false;  // after the peer's Hello, until release()
    // Held, with the Hello read: nothing more is read until release().
    bool held_past_hello() const { return held_ && rx_ != RxState::Hello; }
    const TlsContext& tls_ctx_;
    UniqueFd fd_;
    TlsChannel tls_;
    // Once the Hellos are through: the frames in each direction.
    std::unique_ptr<FrameChannel> frames_;
    bool send_frames_ = false, recv_frames_ = false;
    bool dialed_;
    std::string remote_;
    LinkState state_ = LinkState::Handshake;
    bool became_up_ = false;
    bool auth_failed_ = false;
    bool tampered_ = false;
    bool mode_mismatch_ = false;
    bool close_after_flush_ = false;
    std::string close_reason_;
    Hello mine_{}, peer_{};

    // Receiving.
    RxState rx_ = RxState::Hello;
    std::vector<uint8_t> rbuf_;
    size_t rpos_ = 0, rend_ = 0;
    SegHeader hdr_{};
    InMsg* cur_ = nullptr;       // the message the current segment belongs to (null: discard)
    uint64_t seg_left_ = 0;      // payload bytes of the current segment still to come
    uint64_t seg_offset_ = 0;    // where they go in the message
    bool paused_ = false;        // a response queue is full: stop reading
    bool short_read_ = false;    // the last read emptied the socket
    uint64_t last_rx_ns_ = 0;
    std::vector<std::unique_ptr<InMsg>> inbound_, free_inbound_;
    std::vector<uint8_t> discard_;
    // The P_Key tables the peer announced, by LID (at most one per LID it owns).
    struct PkeyTable {
        uint16_t keys[kMaxPkeys];
        uint32_t count = 0;
    };
    std::unordered_map<uint16_t, PkeyTable> peer_pkeys_;
    uint8_t announce_[2 * kMaxPkeys] = {};  // the announcement being received
    uint8_t cm_[kMaxCmPayload] = {};        // the CM message being received

    // Sending.
    std::vector<uint8_t> raw_;   // the Hello and error bytes, before any segment
    size_t raw_pos_ = 0;
    bool hello_sent_ = false;
    // Headers and small or fragile pieces of the batch, copied for one write.
    std::vector<uint8_t> stage_;
    size_t stage_len_ = 0, stage_pos_ = 0;
    FlatMap<uint64_t, std::unique_ptr<QpSender>> senders_;  // by qp_key(lid, QPN)
    // The queue sender() found last, looked at before the map (a stream's
    // messages and their ACKs name one QP); forgotten when it leaves the map.
    QpSender* last_sender_ = nullptr;
    std::vector<std::unique_ptr<QpSender>> idle_senders_;  // emptied queues, reused
    std::deque<QpSender*> rr_;
    std::vector<QpSender*> delayed_acks_;
    uint64_t ack_delay_ns_ = 0, ack_due_ns_ = 0;
    uint32_t acks_delayed_ = 0;  // messages the delayed ACKs acknowledge
    std::vector<iovec> iov_;
    std::vector<OutMsg*> iov_msg_;  // parallel to iov_: whose payload (null: a header or fixed part)
    size_t iov_pos_ = 0;
    std::vector<SegHeader> seg_hdrs_;
    std::vector<OutMsg*> seg_msg_;  // parallel to seg_hdrs_
    std::vector<QpSender*> batch_senders_;
};

}  // namespace vrdma::shim::fabric
