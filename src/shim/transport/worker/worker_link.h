// The transport between two workers of one shim (docs/protocol.md
// "Workers"). Each worker serves its own guests and touches nothing of
// another worker's: a request of a guest on worker A to a guest on worker B
// goes to B as a message, B's responder runs it and moves the payload (one
// memcpy between the two guests' memory, as the local transport does), and
// the answer comes back to A's requester as a message. It is the fabric's
// protocol (a request, then a response; incarnations bind connections) with
// shared memory instead of a socket: no loss, no bounce buffer.
//
// Messages go into the receiving worker's inbox, a lock-free ring that
// every other worker writes and it alone reads (mpsc_ring.h); each
// sender's messages keep their order. Requests wait for room (SendResult
// Busy: the requester offers the WQE again, so a full inbox is
// back-pressure on the QPs that feed it); answers and notices never wait:
// what finds the inbox full waits in the link's list and goes first on the
// next poll. A large
// transfer goes in slices of TurnScheduler::kSliceBytes, one message each, handed
// over while the sender's turn lasts (sliced_transfer.h), so that B's work
// per message is bounded and other QPs' messages pass between the slices.
//
// Memory: the requester's mappings are pinned (Pins) and travel with the
// request, and come back with its answer, so that a mapping is only ever
// unmapped (and its quota given back) by the worker that owns its guest.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>

#include "request.h"
#include "responder.h"
#include "mpsc_ring.h"
#include "device_model.h"
#include "transport.h"
#include "vrdma/abi.h"
#include "vrdma_common/unique_fd.h"
#include "work_queue.h"

namespace vrdma::shim {

struct WorkerMsg {
    enum class Kind : uint8_t {
        Request,  // to the responder's worker: a request, or one slice of it
        Response, // back: the responder's answer to an RC request; the pins return
        Sent,     // back: a UD or UC request was delivered (its payload left the sender's memory)
        Abort,    // to the responder's worker: the requester gave up the transfer in slices
        Release,  // back: the answer to Abort; the pins return
        QpGone,   // to the worker of `lid`: the QP (peer_lid, peer_qpn) it is connected to vanished or failed
    };
    Kind kind = Kind::Request;
    Request req;  // Request (its wqe pointer cleared)
    // Request: the slice [offset, offset + bytes) of the payload; first and
    // last say where it stands (a message in one piece is both).
    uint64_t offset = 0, bytes = 0;
    bool first = true, last = true;
    // Request: the requester's memory (SEND and WRITE payload, or where READ
    // data goes), pinned by `pins` (carried by the first slice).
    Span local[abi::kMaxSge];
    uint32_t nlocal = 0;
    Pins pins;
    alignas(16) uint8_t inline_data[abi::kMaxInline];  // req.inline_payload
    // A multicast copy larger than inline_data (up to the port MTU): made
    // the first time this slot carries one, and kept for the next.
    std::unique_ptr<uint8_t[]> large;
    uint8_t* payload_room(uint64_t bytes) {
        if (bytes <= sizeof(inline_data)) return inline_data;
        if (!large) large = std::make_unique<uint8_t[]>(kPortMtuBytes);
        return large.get();
    }
    // Answers and notices: the QP they are for and the other end.
    Response resp;
    uint16_t lid = 0, peer_lid = 0;
    uint32_t qpn = 0, peer_qpn = 0;
    uint32_t sq_idx = 0;  // Sent: the send queue index of the WQE
    int event = 0;        // QpGone: the async event the survivor raises
    uint32_t from = 0;    // the worker that sent it
};

// How a worker is woken when it sleeps (worker.h): the other workers kick
// its eventfd after publishing a message, if it said it sleeps.
struct WorkerWake {
    std::atomic<bool> asleep{false};
    UniqueFd fd;  // an eventfd (none in single-threaded tests)
    // After publishing: wakes the worker if it is asleep. The store of the
    // message and the load of `asleep` are ordered (seq_cst) against the
    // worker's store of `asleep` and its last look at the rings.
    void kick();
};

// What other workers send a worker, and how to wake it.
struct WorkerInbox {
    static constexpr uint32_t kDepth = 256;
    MpscRing<WorkerMsg> ring{kDepth};
    WorkerWake wake;
};

class WorkerLink;
// The consumer's side of `inbox`: each message goes to the link to the
// worker that sent it (`links[from]`), up to `budget` bytes of payload (at
// least one message). True if anything was received.
bool receive_messages(WorkerInbox& inbox, WorkerLink* const* links, uint32_t nlinks, uint64_t budget);

class WorkerLink final : public Transport {
public:
    // The link of worker `self` (engine `eng`) to worker `peer`, whose
    // inbox is `peer_inbox`.
    WorkerLink(Engine& eng, uint32_t self, uint32_t peer, WorkerInbox& peer_inbox);
    ~WorkerLink() override;

    const char* name() const override { return "worker"; }
    bool keeps_memory() const override { return true; }
    SendResult send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local, uint32_t nlocal,
                    Pins* pins, Response& resp) override;
    // The other worker answers every request (a drop too): a late answer is
    // late, never lost.
    bool delivering_since(uint64_t) const override { return true; }
    bool within_shim() const override { return true; }
    // With --hca-local: RC and UC QPs to the other worker's guests go
    // through the device, as those of this worker's do (local_transport.h).
    const uint8_t* device_gid() const override { return device_gid_; }
    void set_device_gid(const uint8_t* gid) { device_gid_ = gid; }
    void qp_gone(uint16_t lid, uint32_t qpn, uint16_t peer_lid, uint32_t peer_qpn, int event) override;
    void abandon(Engine& eng, Qp& qp) override;
    // A multicast datagram for the other worker's members: handed over if
    // its inbox has room now (nothing waits for room: one that would is
    // dropped).
    bool send_copy(Engine& eng, const Request& req, const uint8_t* payload) override;

    // A message the other worker sent (receive_messages): a request for
    // this worker's guests (the responder runs here and the payload moves
    // here), or an answer for its requesters. Returns the payload bytes it
    // moved.
    uint64_t receive(WorkerMsg& m);
    // Sends what waited for room in the other worker's inbox. True if
    // anything went.
    bool flush();
    // Nothing waiting to be written.
    bool idle() const { return waiting_.empty(); }

    uint32_t peer() const { return peer_; }
    struct Stats {
        uint64_t requests_out = 0;  // requests (and slices) handed to the other worker
        uint64_t requests_in = 0;   // requests (and slices) it handed to this one
        uint64_t copied_bytes = 0;  // payload this worker copied for them
        uint64_t ring_full = 0;     // requests that found the ring full (back-pressure)
    };
    const Stats& stats() const { return stats_; }

private:
    // A request of the other worker's QP (slid, sqpn) that arrives in
    // slices: the responder's decision and memory, and the requester's pins.
    struct Inbound {
        Request req;
        Delivery d;
        Pins target, source;
        bool discard = false;  // decided not to move (refused, dropped, failed)
    };
    static uint64_t key(uint16_t lid, uint32_t qpn) { return uint64_t(lid) << 32 | qpn; }

    // A slot to write a message into: the ring's, or one waiting for room
    // (answers, which must not be lost). Then commit().
    WorkerMsg& answer_slot();
    void commit(WorkerMsg& m);
    void on_request(WorkerMsg& m);
    void on_answer(WorkerMsg& m);
    void answer(const Request& req, const Response& resp, Pins& pins);
    void fill_request(WorkerMsg& m, const Request& req, const Span* local, uint32_t nlocal, Pins* pins);

    // A slot in the other worker's inbox (null: full), and its publication.
    WorkerMsg* claim();
    void publish();

    Engine& eng_;
    uint32_t self_, peer_;
    WorkerInbox& out_;
    std::deque<WorkerMsg> waiting_;  // answers that found the inbox full, in order
    WorkerMsg* reserved_ = nullptr;  // answer_slot's pick in the inbox
    uint64_t reserved_pos_ = 0;
    std::unordered_map<uint64_t, std::unique_ptr<Inbound>> inbound_;
    Inbound one_;  // a request in one piece (no allocation)
    Stats stats_;
    const uint8_t* device_gid_ = nullptr;
};

}  // namespace vrdma::shim
