// The objects a context owns: PDs, MRs, CQs, QPs, SRQs, AHs. Each lives in a
// HandleTable of its context and refers to others by handle (never by
// pointer), so freeing one can never leave a dangling reference: a stale
// handle simply fails to resolve.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "segment_table.h"
#include "vrdma/abi.h"

namespace vrdma::shim {

// What an object keeper (transport.h, "The guest's objects") keeps beside a
// guest's PD, MR, window, SRQ, QP or AH: an object of the keeper's own type
// (the device's PD for the guest's, on a shim with a device), derived from
// this, in the guest object's `kept` slot. It goes with the guest object
// and its destructor is the keeper's code; the engine never sees it whole,
// and only the keeper that made it reads it (a shim has at most one keeper:
// Engine::add_object_keeper).
struct KeptObject {
    virtual ~KeptObject() = default;
};
using Kept = std::shared_ptr<KeptObject>;

struct Pd {
    uint32_t users = 0;  // MRs, QPs, SRQs, AHs created in it
    Kept kept;  // with a device: its device PD
};

struct Mr {
    uint32_t pd = 0;
    uint32_t key = 0;     // lkey = rkey (Context::keys)
    uint32_t access = 0;  // ibv_access_flags
    uint64_t addr = 0;    // gva
    uint64_t length = 0;
    HostRange mem;        // contiguous shim mapping of [addr, addr+length)
    // IBV_ACCESS_ON_DEMAND over memory not all shared at registration (the
    // implicit MR, or a range with holes): no `mem`; each access is
    // translated through the context's segments as they are then
    // (mr_bytes, work_queue.h).
    bool on_demand = false;
    // On demand: mappings composed of several segments for ranges that
    // straddle them (at most kMaxComposed, kept until the MR goes), charged
    // to the guest; an access that would need one more fails.
    static constexpr size_t kMaxComposed = 4 * abi::kMaxSge;
    mutable std::vector<HostRange> composed;
    uint64_t charged_bytes = 0;  // MrBytes taken from the guest's quota
    uint32_t bound_windows = 0;  // memory windows bound to it: it cannot change or go
    // With a device: the registration whose key is `key` (null if the
    // device refused the memory: the MR then serves local and TCP only).
    Kept kept;
};

// A memory window (memory_windows.h). Bound, it grants remote access to
// [addr, addr+length) of one MR of its PD with its own rkey and access; a
// type 2 window only to requests arriving on the QP it was bound through.
struct Mw {
    uint32_t pd = 0;
    uint32_t type = 0;    // IBV_MW_TYPE_1 or IBV_MW_TYPE_2
    uint32_t key = 0;     // rkey (Context::keys): the index is fixed, binds change the tag
    bool bound = false;
    uint32_t mr = 0;      // bound: the MR's handle
    uint32_t qp = 0;      // bound, type 2: the QP's handle
    uint32_t access = 0;  // bound: IBV_ACCESS_REMOTE_*
    uint64_t addr = 0;
    uint64_t length = 0;
    // With a device: its device window, whose rkey `key` is (null if the
    // device refused: the window then serves this host and TCP only).
    Kept kept;
};

struct Cq {
    abi::RingHeader* ring = nullptr;
    abi::CqNotify* notify = nullptr;
    abi::Cqe* slots = nullptr;
    uint32_t entries = 0;
    uint32_t prod = 0;            // shim-owned producer index (never read back)
    uint32_t produced = 0;        // completions added, for RingHeader::produced
    // The guest's consumer index as last read and checked: read again only
    // when the ring looks full by it, so that a completion does not pull
    // the line the guest writes at every poll (cq_push).
    uint32_t cons_seen = 0;
    // Completion channel (cq_events.h). The CQ is armed while the guest's
    // notify->arm_seq differs from last_arm_seq (the arm_seq an event
    // consumed).
    uint32_t channel_id = 0;      // 0: no channel
    uint32_t last_arm_seq = 0;
    // The newest completions written while the CQ was not armed for them
    // ("silent"), as producer indices just past them: an arming that finds
    // one still unpolled raises its event (cq_check_armings).
    uint32_t silent_end = 0, silent_solicited_end = 0;
    bool silent = false, silent_solicited = false;
    bool silent_listed = false;   // on Context::silent_cqs
    uint32_t comp_events = 0;     // event records written (reported at DestroyCq)
    uint32_t async_events = 0;
    uint64_t user_handle = 0;
    bool error = false;           // overrun or invalid consumer index
    bool timestamps = false;      // abi::kCqTimestamps: cq_push stamps each completion
    uint32_t users = 0;           // QPs using it
    std::shared_ptr<Mapping> keep;
};

// A send queue, receive queue or SRQ ring. The shim is the consumer.
struct WorkQueue {
    abi::RingHeader* ring = nullptr;
    uint8_t* slots = nullptr;
    uint32_t entries = 0;
    uint32_t stride = 0;
    uint32_t cons = 0;            // shim-owned consumer index
    bool broken = false;          // the guest wrote an invalid producer index
    std::shared_ptr<Mapping> keep;

    uint8_t* slot(uint32_t idx) const { return slots + uint64_t(idx & (entries - 1)) * stride; }
};

// An XRC domain (cmd_xrcd.cpp): XRC_RECV QPs and XRC SRQs of one domain
// work together.
struct Xrcd {
    uint32_t users = 0;  // XRC_RECV QPs and XRC SRQs in it
};

// A tag-matching SRQ's list of tagged buffers (IBV_SRQT_TM;
// tag_matching.h).
struct TagEntry {
    bool used = false;
    uint32_t generation = 0;  // bumped when the entry is freed: a stale handle names nothing
    uint64_t seq = 0;  // order of posting: of the entries that match, the earliest wins
    uint64_t tag = 0;
    uint64_t mask = 0;
    uint64_t recv_wr_id = 0;
    uint32_t num_sge = 0;
    abi::Sge sge[abi::kMaxTmSge]{};
};
struct TagList {
    std::vector<TagEntry> entries;  // max_num_tags, sized at creation
    uint64_t next_seq = 1;
    // Phase synchronization (docs/protocol.md "Tag matching"): tagged
    // messages delivered as unexpected, and the count software last
    // reported. Tags match only while the two agree.
    uint32_t unexpected = 0;
    uint32_t reported = 0;
    bool synced() const { return reported == unexpected; }
};

// A rendezvous request matched at a QP on a TM SRQ whose read and FIN
// run in that QP's next pass (tag_matching.h), after the sender saw its
// send complete, as on a device. A sender on this worker is read directly;
// one on another worker or shim through the QP's transport, in pieces
// (kTmRndvRead), then told with a kTmRndvFin (request.h).
struct PendingRendezvous {
    abi::Cqe cqe{};         // the message's completion as prepared (QP, source)
    uint64_t sender_incarnation = 0;  // the sending QP this QP is bound to
    uint64_t done = 0;      // bytes read so far (direct) or asked for (remote)
    bool remote = false;    // the sender is on another worker or shim
    // Remote: the pieces are requests first_psn, first_psn + 1, ... (the
    // QP's tm_next_psn when it matched), answered in order.
    uint32_t first_psn = 0;
    uint32_t pieces = 0;    // how many (0 for no data: the FIN alone)
    uint32_t asked = 0;     // requests sent so far
    uint32_t answered = 0;  // answers taken so far
    bool fin_due = false;   // every piece arrived: the FIN is next
    uint64_t since_ns = 0;  // the oldest unanswered request left, or the last answer came
    uint32_t cq = 0;        // the TM SRQ's CQ
    uint32_t srq = 0;       // the TM SRQ (its PD holds the tagged buffer's keys)
    uint64_t recv_wr_id = 0;
    uint32_t num_sge = 0;
    abi::Sge sge[abi::kMaxTmSge]{};
    uint8_t headers[32]{};  // the TMH and RVH
};

struct Srq {
    uint32_t pd = 0;
    uint32_t xrcd = 0;            // an XRC SRQ: its domain (0: a basic SRQ)
    uint32_t cq = 0;              // an XRC or TM SRQ: where its receive completions go
    WorkQueue wq;
    uint32_t max_sge = 0;
    uint32_t limit = 0;           // armed when nonzero
    uint32_t srqn = 0;
    uint64_t user_handle = 0;
    uint32_t users = 0;           // QPs attached
    uint32_t async_events = 0;    // records written (reported at DestroySrq)
    Kept kept;                       // with a device: its device SRQ (hca_bind.h)
    bool feeds_device = false;       // its WQEs go to the device SRQ; the shim takes none
    std::unique_ptr<TagList> tm;     // a TM SRQ: its tag list (null otherwise)
};

class Transport;

// A large transfer a transport moves one slice per turn
// (sliced_transfer.h).
struct SlicedCopy;
struct SlicedCopyDeleter {
    void operator()(SlicedCopy* s) const;
};

// Why a QP's send queue is paused on its oldest WQE: an RNR NAK, or a lost
// request (a timeout) waiting to be sent again.
enum class SqWait : uint8_t { None, Rnr, Retry };

// XRC (IBA 9.8, 11.2.7): an XRC_SEND QP is an RC requester whose messages
// each name an XRC SRQ of the target's domain; an XRC_RECV QP is an RC
// responder with no queues of its own, which delivers each message to the
// SRQ it names. Both are type IBV_QPT_RC to the engine.
enum class XrcRole : uint8_t { None, Send, Recv };

// The requester's side of a QP (requester.h). WQEs [sq.cons, sq_next) are
// in flight: sent, not yet acknowledged; they stay in the ring until then,
// and the consumer index the guest sees moves as each one completes. One
// PSN per message: the WQE at sq.cons has una_psn, the one at sq_next
// next_psn.
struct QpRequester {
    uint32_t sq_next = 0;
    uint32_t una_psn = 0;
    uint32_t next_psn = 0;
    uint32_t sent_high = 0;          // PSN after the highest ever sent (lower ones are resends)
    SqWait wait = SqWait::None;      // blocks new sends until deadline_ns
    uint64_t deadline_ns = 0;
    uint64_t ack_deadline_ns = 0;    // in flight: when the oldest request times out
    uint64_t ack_since_ns = 0;       // when that timer started (a send, or progress)
    uint8_t retries_left = 0;        // of attr.retry_cnt, reset by progress
    bool rewound = false;            // went back to una_psn and has not moved past it since
    uint8_t rnr_left = 0;            // of attr.rnr_retry (7: forever)
    uint32_t drain_end = 0;          // SQD: the WQEs before this index still run
    bool draining = false;           // SQD reached, a WQE still in flight
    bool sqd_notify = false;         // raise SQ_DRAINED when the drain finishes
    // The transfer of the WQE at sq_next, while a transport moves it slice
    // by slice (sliced_transfer.h; kept between transfers: no allocation
    // per message).
    std::unique_ptr<SlicedCopy, SlicedCopyDeleter> sliced;
    // UD and UC WQEs in flight over the fabric whose payload was sent, by
    // send queue slot (requester_sent: they complete in order; a datagram
    // to another peer may leave first). Sized once, at the first such WQE.
    std::vector<uint8_t> sent_flags;
    // What is in flight went through the transport that carries the QP
    // (all of it: a UD QP on the device waits for idle before it sends
    // another way).
    bool inflight_carried = false;
};

// The responder's side of a QP (responder.h).
struct QpResponder {
    uint32_t epsn = 0;               // PSN expected next
    bool atomic_replay_valid = false;  // the last atomic, for a resent duplicate
    uint32_t atomic_replay_psn = 0;
    uint64_t atomic_replay_orig = 0;
    bool comm_est_sent = false;      // COMM_EST already raised since the QP left RESET
    // On a TM SRQ (tag_matching.h): the message being received, held here
    // until the tag list decides where it goes (made at the first one);
    // the rendezvous matched and not done yet, oldest first, and the PSNs
    // of the reads and FINs they send.
    std::shared_ptr<Mapping> tm_staging;
    bool tm_staging_busy = false;    // a message is in it (another waits: RNR)
    std::vector<PendingRendezvous> tm_rendezvous;
    uint32_t tm_next_psn = 0;
    uint32_t tm_fins_lost = 0;       // rendezvous FINs to this QP that found no receive (logged once)
};

struct Qp {
    uint32_t handle = 0;          // its handle in the context's table
    bool work_marked = false;     // in the context's list of QPs with work (Context::mark_work)
    uint32_t qpn = 0;
    // This QP's incarnation (Engine::new_incarnation) and, for RC, the one it
    // was connected to at RTR when that peer is on this shim (0: none found,
    // or the peer is on another shim).
    uint64_t incarnation = 0;
    uint64_t peer_incarnation = 0;
    uint32_t type = 0;            // IBV_QPT_RC, IBV_QPT_UC or IBV_QPT_UD
    XrcRole xrc = XrcRole::None;  // type RC: an XRC QP
    uint32_t xrcd = 0;            // XrcRole::Recv: its domain
    uint32_t pd = 0, send_cq = 0, recv_cq = 0, srq = 0;
    WorkQueue sq, rq;             // rq unused when srq != 0
    uint32_t max_send_sge = 0, max_recv_sge = 0, max_inline = 0;
    bool sig_all = false;
    uint64_t user_handle = 0;
    uint32_t state = 0;           // ibv_qp_state
    abi::QpAttr attr{};           // attributes set by ModifyQp

    // The transport its traffic takes: RC, bound to the route of
    // attr.ah.dlid (route_gen: the route table generation it was bound at),
    // or the one that carries it whole.
    Transport* transport = nullptr;
    uint32_t route_gen = 0;
    // With a device: the device QP whose QPN is `qpn` (hca_bind.h).
    Kept kept;
    // A transport carries the QP whole, `transport`, until RESET (the
    // device, once bound: hca_bind.h): it posts the QP's WQEs as they are
    // and does what the requester's timers and the peer's responder do
    // otherwise, and the QP's WQEs complete through it.
    bool carried = false;

    // The two sides, as in rxe: what the QP sends, what it receives.
    QpRequester req;
    QpResponder resp;

    // What isolation stopped at this QP (guest_security.h).
    uint64_t remote_access_errors = 0;
    uint64_t stranger_requests = 0;

    uint32_t async_events = 0;    // records written (reported at DestroyQp: async_events.h)
};

struct Ah {
    uint32_t pd = 0;
    abi::AhAttr attr{};
    // With a device: the path its datagrams take through the device, made
    // at the first one that goes there (hca_ud.h).
    Kept kept;
};

}  // namespace vrdma::shim
