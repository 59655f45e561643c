#include "link.h"

#include <infiniband/verbs.h>
#include <limits.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "clock.h"
#include "engine.h"
#include "fault_guard.h"
#include "multicast_delivery.h"
#include "multicast_groups.h"
#include "psn.h"
#include "qp_state.h"
#include "requester.h"
#include "tag_matching.h"
#include "vrdma_common/log.h"

namespace vrdma::shim::fabric {
namespace {

constexpr size_t kRecvBuffer = 256 * 1024;
constexpr size_t kDirectReadMin = 16 * 1024;   // payload left at least this: read it straight into place
constexpr size_t kMaxSegsPerBatch = 256;
constexpr size_t kMaxIovPerBatch = 960;        // below IOV_MAX (1024)
constexpr size_t kBatchBytes = 1024 * 1024;
constexpr size_t kReadBudget = 4 * 1024 * 1024;  // bytes handled per on_readable call
constexpr size_t kMaxInbound = 4096;          // unfinished incoming messages per link
// Pieces at least this long go to the channel straight from guest memory;
// shorter ones (headers, small payloads) are gathered into one frame.
constexpr size_t kDirectWriteMin = 4096;
constexpr size_t kStageBytes = kMaxFrameData;
// What is written in place of guest memory that vanished under a write.
const uint8_t kZeros[kMaxSegmentPayload] = {};

uint64_t qp_key(uint16_t lid, uint32_t qpn) { return (uint64_t(lid) << 32) | qpn; }

// iovecs for `len` bytes of a scatter list from byte `off`.
size_t spans_to_iov(const Span* spans, uint32_t n, uint64_t off, uint64_t len, iovec* out, size_t max) {
    size_t k = 0;
    for (uint32_t i = 0; i < n && len > 0 && k < max; ++i) {
        if (off >= spans[i].len) {
            off -= spans[i].len;
            continue;
        }
        uint64_t take = std::min(len, spans[i].len - off);
        out[k].iov_base = spans[i].p + off;
        out[k].iov_len = take;
        ++k;
        len -= take;
        off = 0;
    }
    return k;
}

}  // namespace

struct Link::InMsg {
    uint8_t type = 0;
    uint16_t lid = 0;      // the QP that sent it
    uint32_t qpn = 0;
    uint64_t total = 0;    // payload bytes announced
    uint64_t received = 0;
    bool discard = false;  // payload read and dropped
    bool aborted = false;  // the sender lost its memory under the payload (kSegAbort)
    bool faulted = false;  // the target memory lost a page under the payload
    bool foreign = false;  // a request from a LID the peer does not own: read, dropped, never answered
    // A multicast datagram: its payload lands in `staged` (made the first
    // time this slot takes one), and goes to the members from there.
    bool multicast = false;
    std::unique_ptr<uint8_t[]> staged;
    // A request (responder side).
    Request req;
    Delivery d;
    Pins pins;
    // A response (requester side).
    Response resp;
    uint16_t dst_lid = 0;
    uint32_t dst_qpn = 0;
    uint32_t local_error = 0;  // READ data with nowhere to go: the WQE fails with this
    Span spans[abi::kMaxSge];
    uint32_t nspans = 0;

    // Ready for the next message. Field by field: assigning a fresh InMsg
    // would also move-assign its 32 pins and clear its scatter list, per
    // message (the pins were dropped when it was released).
    void reset() {
        type = 0;
        lid = 0;
        qpn = 0;
        total = received = 0;
        discard = aborted = faulted = foreign = multicast = false;
        // req is left as it was: decode() writes all of it for a request,
        // and nothing else reads it.
        d.reset();
        pins.clear();
        resp = Response{};
        dst_lid = 0;
        dst_qpn = 0;
        local_error = 0;
        nspans = 0;
    }

    // Where payload byte `off` of the message lands.
    const Span* target(uint32_t& n, uint64_t& skip) const {
        if (type == uint8_t(SegType::Request)) {
            n = d.nspans;
            skip = d.skip;
            return d.spans;
        }
        n = nspans;
        skip = 0;
        return spans;
    }
};

namespace {
LinkIdentity identity(const InstanceId& instance, uint16_t lid_first, uint16_t lid_last, uint16_t listen_port) {
    LinkIdentity me;
    me.instance = instance;
    me.lid_first = lid_first;
    me.lid_last = lid_last;
    me.listen_port = listen_port;
    return me;
}
}  // namespace

Link::Link(Engine& eng, const TlsContext& tls, UniqueFd fd, bool dialed, const InstanceId& instance,
           uint16_t lid_first, uint16_t lid_last, uint16_t listen_port, std::string remote)
    : Link(eng, tls, std::move(fd), dialed, identity(instance, lid_first, lid_last, listen_port), std::move(remote)) {}

Link::Link(Engine& eng, const TlsContext& tls, UniqueFd fd, bool dialed, const LinkIdentity& me, std::string remote)
    : eng_(&eng),
      held_(me.hold),
      tls_ctx_(tls),
      fd_(std::move(fd)),
      tls_(tls, fd_.get(), dialed),
      dialed_(dialed),
      remote_(std::move(remote)) {
    ack_delay_ns_ = me.ack_delay_ns;
    rbuf_.resize(kRecvBuffer);
    stage_.resize(kStageBytes);
    discard_.resize(kMaxSegmentPayload);
    iov_.reserve(kMaxIovPerBatch + 64);
    seg_hdrs_.reserve(kMaxSegsPerBatch);
    iov_msg_.reserve(kMaxIovPerBatch + 64);
    seg_msg_.reserve(kMaxSegsPerBatch);
    mine_.magic = kHelloMagic;
    mine_.version = kProtocolVersion;
    std::memcpy(mine_.instance, me.instance.data(), sizeof(mine_.instance));
    mine_.crypto_mode = uint8_t(tls.mode());
    mine_.lid_first = me.lid_first;
    mine_.lid_last = me.lid_last;
    mine_.listen_port = me.listen_port;
    mine_.workers = me.workers;
    mine_.worker = me.worker;
    mine_.target = me.target;
    if (const uint8_t* gid = eng.device_gid()) std::memcpy(mine_.device_gid, gid, sizeof(mine_.device_gid));
    // Sent once the handshake is done (flush), as the first record.
    send_raw(&mine_, sizeof(mine_));
}

Link::~Link() {
    if (state_ != LinkState::Closed) close("shutting down");
}

void Link::send_raw(const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    raw_.insert(raw_.end(), b, b + n);
}

bool Link::drive_handshake() {
    if (tls_.handshake_done()) return true;
    switch (tls_.handshake()) {
    case TlsChannel::Step::Done:
        return true;
    case TlsChannel::Step::Again:
        return false;
    case TlsChannel::Step::Failed:
        break;
    }
    // A peer that closes during the handshake has refused it (it does not
    // know the key either, or judged ours wrong): both are a failed handshake.
    auth_failed_ = true;
    ++stats.errors;
    close("authentication failed (TLS handshake: " + tls_.error() + ")");
    return false;
}

ssize_t Link::send_bytes(const void* p, size_t n) {
    ssize_t r = send_frames_ ? frames_->write(p, n) : tls_.write(p, n);
    if (r > 0) {
        stats.tx_bytes += uint64_t(r);
        return r;
    }
    if (r == 0) return 0;
    close(send_frames_ ? "write: " + frames_->error() : "write: " + tls_.error());
    return -1;
}

ssize_t Link::recv_bytes(void* p, size_t n) {
    ssize_t r = recv_frames_ ? frames_->read(p, n) : tls_.read(p, n);
    if (r > 0) {
        stats.rx_bytes += uint64_t(r);
        last_rx_ns_ = monotonic_ns();
        return r;
    }
    if (r == 0) return 0;
    const bool closed = recv_frames_ ? frames_->closed() : tls_.closed();
    const bool bad = recv_frames_ ? frames_->tampered() : tls_.tampered();
    const std::string& err = recv_frames_ ? frames_->error() : tls_.error();
    if (closed) {
        close("the peer closed the connection");
    } else if (bad) {
        tampered_ = true;
        ++stats.errors;
        LOG_WARN("fabric: peer %s: received data failed authentication (%s): a changed byte; closing the connection",
                 remote_.c_str(), err.c_str());
        close("received data failed authentication (" + err + ")");
    } else {
        close("read: " + err);
    }
    return -1;
}

int Link::flush_channel() {
    if (!send_frames_) return 1;  // TLS records go out as they are written
    const int r = frames_->flush_output();
    if (r < 0) close("write: " + frames_->error());
    return r;
}

size_t Link::write_unframed(const void* p, size_t n) {
    size_t done = 0;
    for (int tries = 0; done < n && state_ != LinkState::Closed && tries < 1000; ++tries) {
        ssize_t r = send_bytes(static_cast<const uint8_t*>(p) + done, n - done);
        if (r < 0) break;
        done += size_t(r);
    }
    for (int tries = 0; state_ != LinkState::Closed && tries < 1000; ++tries)
        if (flush_channel() != 0) break;
    return done;
}

bool Link::input_buffered() const {
    if (state_ == LinkState::Closed) return false;
    return recv_frames_ ? frames_->buffered() : tls_.buffered();
}

bool Link::take_became_up() {
    bool b = became_up_;
    became_up_ = false;
    return b;
}

void Link::close(const std::string& reason) {
    if (state_ == LinkState::Closed) return;
    state_ = LinkState::Closed;
    close_reason_ = reason;
    // Incoming messages that never arrived whole: their receives fail. An
    // RC target QP goes to error even without a receive (RDMA WRITE): the
    // responder counted the request as executed when it began, so the
    // requester's resend would be acknowledged as a duplicate with only
    // part of the data written.
    for (auto& m : inbound_) {
        if (m->type == uint8_t(SegType::Request) && !m->discard && m->d.ctx) {
            responder_revalidate(*eng_, m->d);
            responder_end(m->d, PayloadEnd::Lost);
        }
        m->pins.clear();
    }
    inbound_.clear();
    cur_ = nullptr;
    senders_.for_each([this](uint64_t, std::unique_ptr<QpSender>& s) {
        for (uint32_t i = 0; i < s->count; ++i) {
            if (s->at(i).notify_sent) notify_sent(s->at(i));
            s->at(i).pins.clear();
        }
        if (s->wake_ctx)
            if (Context* c = eng_->find_context(s->wake_ctx)) c->request_rescan();
    });
    senders_.clear();
    last_sender_ = nullptr;
    rr_.clear();
    delayed_acks_.clear();
    ack_due_ns_ = 0;
    acks_delayed_ = 0;
    iov_.clear();
    iov_pos_ = 0;
    fd_.reset();
}

void Link::notify_sent(OutMsg& m) {
    m.notify_sent = false;
    if (QpRef q = eng_->qpns().find(m.src_lid, m.src_qpn)) requester_sent(*eng_, *q.ctx, *q.qp, m.sq_idx);
}

bool Link::violation(const char* why) {
    ++stats.errors;
    LOG_WARN("fabric: peer %s: protocol violation: %s: closing the connection", remote_.c_str(), why);
    close(std::string("protocol violation: ") + why);
    return false;
}

void Link::refuse(const std::string& reason) {
    SegHeader h{};
    h.type = uint8_t(SegType::Error);
    h.flags = kSegFirst | kSegLast;
    std::string text = reason.substr(0, 1024);
    h.payload_len = uint32_t(text.size());
    send_raw(&h, sizeof(h));
    send_raw(text.data(), text.size());
    close_after_flush_ = true;
    close_reason_ = reason;
}

// ---------------------------------------------------------------------------
// Receiving
// ---------------------------------------------------------------------------

void Link::on_readable() {
    if (state_ == LinkState::Closed) return;
    if (!tls_.handshake_done()) {
        if (!drive_handshake()) return;
        flush();  // the Hello, now that the channel is up
        if (state_ == LinkState::Closed) return;
    }
    if (held_past_hello()) return;
    size_t handled = 0;
    short_read_ = false;
    while (state_ != LinkState::Closed && handled < kReadBudget) {
        if (!parse() || paused_ || held_past_hello()) return;
        // A read that did not fill what it was offered emptied the socket:
        // what it brought is handled (above) without a read that would
        // only say EAGAIN. Unless a segment is half in: a channel read
        // returns one record at most (16 KiB), and the rest of a segment
        // the peer wrote at once is most likely there already.
        if (short_read_ && !(rx_ == RxState::Fixed || (rx_ == RxState::Payload && seg_left_ > 0))) return;
        size_t before = rend_ - rpos_;
        short_read_ = false;
        if (!fill_buffer()) return;
        size_t after = rend_ - rpos_;
        if (after == before && rx_ != RxState::Payload) return;  // nothing new
        handled += after > before ? after - before : kDirectReadMin;
    }
    // What the last read brought is handled now, not at the next event
    // (there may be none: the peer waits for the answer).
    if (!held_past_hello()) parse();
}

// Reads from the socket: into the receive buffer, or (a long payload with
// nothing buffered) straight into the target memory. False when nothing
// more can be read now or the link closed.
bool Link::fill_buffer() {
    // Straight into place only where a vanished page cannot hurt: OpenSSL
    // writes the bytes, outside the fault guard.
    if (rx_ == RxState::Payload && rpos_ == rend_ && seg_left_ >= kDirectReadMin &&
        !(cur_ && !cur_->discard && cur_->pins.fragile())) {
        iovec iov[abi::kMaxSge];
        size_t k;
        if (cur_ && !cur_->discard) {
            uint32_t n;
            uint64_t skip;
            const Span* t = cur_->target(n, skip);
            k = spans_to_iov(t, n, skip + seg_offset_, seg_left_, iov, abi::kMaxSge);
        } else {
            iov[0].iov_base = discard_.data();
            iov[0].iov_len = std::min<uint64_t>(seg_left_, discard_.size());
            k = 1;
        }
        if (k == 0) return false;
        ssize_t r = recv_bytes(iov[0].iov_base, iov[0].iov_len);
        if (r <= 0) return false;
        short_read_ = size_t(r) < iov[0].iov_len && !input_buffered();
        seg_left_ -= uint64_t(r);
        seg_offset_ += uint64_t(r);
        if (cur_) cur_->received += uint64_t(r);
        if (cur_ && !cur_->discard) stats.rx_payload += uint64_t(r);
        return true;
    }
    if (rpos_ > 0) {
        std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
        rend_ -= rpos_;
        rpos_ = 0;
    }
    if (rend_ == rbuf_.size()) return false;
    // The frames start after the Hello: read no byte past it while the
    // channel is still TLS records.
    const size_t want = rx_ == RxState::Hello ? sizeof(Hello) - rend_ : rbuf_.size() - rend_;
    ssize_t r = recv_bytes(rbuf_.data() + rend_, want);
    if (r <= 0) return false;
    short_read_ = size_t(r) < want && !input_buffered();
    rend_ += size_t(r);
    return true;
}

// Handles every complete unit in the receive buffer. False: the link closed.
bool Link::parse() {
    for (;;) {
        if (state_ == LinkState::Closed) return false;
        const size_t avail = rend_ - rpos_;
        const uint8_t* p = rbuf_.data() + rpos_;
        switch (rx_) {
        case RxState::Hello: {
            if (avail < sizeof(Hello)) return true;
            std::memcpy(&peer_, p, sizeof(Hello));
            rpos_ += sizeof(Hello);
            if (!on_hello()) return false;
            if (held_) return true;  // release() reads on
            break;
        }
        case RxState::Header: {
            if (avail < sizeof(SegHeader)) return true;
            SegHeader h;
            std::memcpy(&h, p, sizeof(h));
            const char* why = "";
            if (!header_ok(h, &why)) return violation(why);
            // A new request will need room for its response: wait for it
            // (back-pressure on the peer) rather than drop it.
            if (h.type == uint8_t(SegType::Request) && (h.flags & kSegFirst)) {
                if (QpSender* s = sender(h.dst_lid, h.dst_qpn, false); s && s->count == QpSender::kDepth) {
                    paused_ = true;
                    return true;
                }
            }
            rpos_ += sizeof(h);
            hdr_ = h;
            seg_left_ = h.payload_len;
            seg_offset_ = h.offset;
            if (h.flags & kSegFirst) {
                rx_ = RxState::Fixed;
            } else if (!on_header()) {
                return false;
            }
            break;
        }
        case RxState::Fixed: {
            if (avail < hdr_.fixed_len) return true;
            if (!on_fixed()) return false;
            break;
        }
        case RxState::Payload: {
            if (seg_left_ == 0) {
                if (!on_payload_done()) return false;
                rx_ = RxState::Header;
                break;
            }
            if (avail == 0) return true;
            uint64_t n = std::min<uint64_t>(avail, seg_left_);
            if (hdr_.type == uint8_t(SegType::Error)) {
                close_reason_.append(reinterpret_cast<const char*>(p), size_t(n));
            } else if (hdr_.type == uint8_t(SegType::Partitions)) {
                std::memcpy(announce_ + seg_offset_, p, size_t(n));  // header_ok: at most sizeof(announce_)
            } else if (hdr_.type == uint8_t(SegType::Cm)) {
                std::memcpy(cm_ + seg_offset_, p, size_t(n));  // header_ok: at most sizeof(cm_)
            } else if (cur_ && !cur_->discard) {
                uint32_t cnt;
                uint64_t skip;
                const Span* t = cur_->target(cnt, skip);
                Span src{const_cast<uint8_t*>(p), n};
                if (copy_sg(t, cnt, skip + seg_offset_, &src, 1, n) != CopyFault::None) target_fault();
                stats.rx_payload += n;
            }
            if (cur_) cur_->received += n;
            rpos_ += n;
            seg_left_ -= n;
            seg_offset_ += n;
            break;
        }
        }
    }
}

// The peer's Hello, the first bytes inside the channel: the link is up if
// it is valid and asks for this shim's crypto mode.
bool Link::on_hello() {
    if (peer_.magic != kHelloMagic) return violation("not a vrdma shim (bad hello)");
    if (peer_.version != kProtocolVersion) return violation("another fabric protocol version");
    if (peer_.reserved != 0 || peer_.reserved2 != 0) return violation("a hello with reserved bits set");
    if (peer_.workers == 0 || peer_.workers > kMaxFabricWorkers ||
        (peer_.worker != kAnyWorker && peer_.worker >= peer_.workers) ||
        (peer_.target != kAnyWorker && peer_.target >= kMaxFabricWorkers))
        return violation("a hello with invalid worker numbers");
    if (std::memcmp(peer_.instance, mine_.instance, sizeof(mine_.instance)) == 0)
        return violation("connected to itself");
    if (peer_.lid_first == 0 || peer_.lid_first > peer_.lid_last || peer_.lid_last > 0xbfff)
        return violation("invalid LID range");
    if (peer_.crypto_mode != mine_.crypto_mode) {
        mode_mismatch_ = true;
        const char* theirs = peer_.crypto_mode == uint8_t(CryptoMode::Encrypt)     ? "encrypt"
                             : peer_.crypto_mode == uint8_t(CryptoMode::Integrity) ? "integrity"
                                                                                   : "unknown";
        const std::string why = std::string("refused: the peer uses --fabric-crypto ") + theirs + ", this shim " +
                                crypto_mode_name(CryptoMode(mine_.crypto_mode));
        ++stats.errors;
        LOG_ERR("fabric: connection %s %s %s", dialed_ ? "to" : "from", remote_.c_str(), why.c_str());
        close(why);
        return false;
    }
    // Nothing may follow the Hello in its record: the frames start next.
    if (rend_ != rpos_ || tls_.buffered()) return violation("bytes after the hello in its record");
    if (!frames_ && !start_frames()) return false;
    recv_frames_ = true;
    state_ = LinkState::Up;
    became_up_ = true;
    rx_ = RxState::Header;
    if (!held_) announce_guests();
    return true;
}

// This worker's guests' partitions, before any request can leave: they
// also tell the peer which of its links reaches each guest.
void Link::announce_guests() {
    for (const auto& g : eng_->guests())
        if (g->lid >= mine_.lid_first && g->lid <= mine_.lid_last) send_partitions(g->lid, g->pkeys);
}

void Link::release(Engine& eng, Transport* routes_to) {
    eng_ = &eng;
    routes_to_ = routes_to;
    if (!held_) return;
    held_ = false;
    if (state_ == LinkState::Up) announce_guests();
}

bool Link::peer_member(uint16_t lid, uint16_t pkey) const {
    auto it = peer_pkeys_.find(lid);
    if (it == peer_pkeys_.end()) return pkey == 0xffff || pkey == 0x7fff;  // the default partition
    for (uint32_t i = 0; i < it->second.count; ++i) {
        const uint16_t k = it->second.keys[i];
        if ((k & 0x7fff) == (pkey & 0x7fff) && (!(pkey & 0x8000) || (k & 0x8000))) return true;
    }
    return false;
}

// The frames of both directions, keyed from the TLS session (the same
// keys on both ends: the dialer's sending labels are the listener's
// receiving ones).
bool Link::start_frames() {
    const CryptoMode mode = tls_ctx_.mode();
    frames_ = std::make_unique<FrameChannel>(fd_.get(), mode, tls_.frame_keys(mode, dialed_),
                                             tls_.frame_keys(mode, !dialed_));
    if (!frames_->error().empty()) {
        close("cannot start the frames: " + frames_->error());
        return false;
    }
    return true;
}

// A continuation segment: it belongs to the unfinished message of its QP.
bool Link::on_header() {
    if (hdr_.type == uint8_t(SegType::Error)) return violation("continued error segment");
    cur_ = find_inbound(hdr_.type, hdr_.src_lid, hdr_.src_qpn);
    if (!peer_owns(hdr_.src_lid) && !(cur_ && cur_->foreign))
        return violation("a segment from a LID the peer does not own");
    if (!cur_) return violation("a continuation of no message");
    if (hdr_.flags & kSegAbort) cur_->aborted = true;
    if (hdr_.offset != cur_->received) return violation("a segment out of order");
    if (hdr_.payload_len > cur_->total - cur_->received) return violation("more payload than announced");
    rx_ = RxState::Payload;
    return true;
}

bool Link::on_fixed() {
    const uint8_t* p = rbuf_.data() + rpos_;
    rpos_ += hdr_.fixed_len;
    rx_ = RxState::Payload;
    if (hdr_.type == uint8_t(SegType::Error)) {
        close_reason_.clear();
        cur_ = nullptr;
        return true;
    }
    // A request from a LID the peer does not own is read and dropped (the
    // peer is trusted for its own LIDs only); anything else from one is a
    // protocol violation.
    const bool foreign = !peer_owns(hdr_.src_lid);
    if (foreign && hdr_.type != uint8_t(SegType::Request))
        return violation("a segment from a LID the peer does not own");
    if (hdr_.type == uint8_t(SegType::Partitions) || hdr_.type == uint8_t(SegType::Cm)) {
        cur_ = nullptr;
        return true;  // kept when its payload is in (on_payload_done)
    }
    if (hdr_.type == uint8_t(SegType::QpGone)) {
        cur_ = nullptr;
        eng_->fail_peer_qp(hdr_.src_lid, hdr_.src_qpn, hdr_.dst_lid, hdr_.dst_qpn);
        return true;
    }
    if (hdr_.type == uint8_t(SegType::UdQp)) {
        cur_ = nullptr;
        if (ud_owners.size() >= kMaxUdOwners && !ud_owners.count(hdr_.src_qpn))
            return violation("too many UD QPs announced");
        ud_owners[hdr_.src_qpn] = UdOwner{hdr_.src_lid, hdr_.offset};
        return true;
    }
    if (hdr_.offset != 0) return violation("a first segment at a nonzero offset");
    if (find_inbound(hdr_.type, hdr_.src_lid, hdr_.src_qpn)) return violation("a new message before the last one ended");
    InMsg* m = new_inbound();
    if (!m) return violation("too many unfinished messages");
    m->type = hdr_.type;
    m->lid = hdr_.src_lid;
    m->qpn = hdr_.src_qpn;
    cur_ = m;
    ++stats.rx_msgs;
    if (hdr_.type == uint8_t(SegType::Request)) {
        // Decoded in place: the message keeps its request (a copy less).
        Request& req = m->req;
        if (!decode(hdr_, p, req)) return violation("malformed request");
        // Checked before the responder acts: an atomic is executed at once.
        if (hdr_.payload_len > (request_carries_payload(req.opcode) ? req.length : 0))
            return violation("more payload than announced");
        if (foreign) {
            ++stats.foreign_lid;
            m->foreign = m->discard = true;
            m->total = request_carries_payload(req.opcode) ? req.length : 0;
            LOG_DEBUG("fabric: peer %s: a request from lid %u, which it does not own: dropped", remote_.c_str(),
                      req.slid);
        } else {
            begin_request(*m);
        }
    } else {
        WireResponse w;
        std::memcpy(&w, p, sizeof(w));
        Response resp;
        uint64_t length;
        if (!decode(w, resp, length)) return violation("malformed response");
        if (resp.psn != hdr_.psn) return violation("response PSN differs from its segment's");
        if (length && resp.syndrome != Syndrome::Ack) return violation("a NAK with data");
        begin_response(*m, resp, length);
    }
    if (hdr_.payload_len > m->total) return violation("more payload than announced");
    return true;
}

bool Link::on_payload_done() {
    if (hdr_.type == uint8_t(SegType::Error)) {
        LOG_ERR("fabric: peer %s refused this shim: %s", remote_.c_str(), close_reason_.c_str());
        close("refused by the peer: " + close_reason_);
        return false;
    }
    if (hdr_.type == uint8_t(SegType::Cm)) {
        if (on_cm) on_cm(hdr_.src_lid, cm_, hdr_.payload_len);
        return true;
    }
    if (hdr_.type == uint8_t(SegType::Partitions)) {
        if (peer_pkeys_.size() >= size_t(peer_.lid_last - peer_.lid_first) + 1 && !peer_pkeys_.count(hdr_.src_lid))
            return violation("more partition tables than LIDs");
        PkeyTable& t = peer_pkeys_[hdr_.src_lid];
        t.count = hdr_.payload_len / 2;
        std::memcpy(t.keys, announce_, hdr_.payload_len);
        // The guest is served at the other end of this link (peer_owns:
        // in the peer's range, which no other live peer overlaps).
        if (routes_to_) eng_->routes().assign(hdr_.src_lid, routes_to_);
        return true;
    }
    InMsg* m = cur_;
    cur_ = nullptr;
    if (!m || !(hdr_.flags & kSegLast)) return true;
    if (m->received != m->total) return violation("a message shorter than announced");
    if (m->type == uint8_t(SegType::Request))
        finish_request(*m);
    else
        finish_response(*m);
    release_inbound(m);
    return state_ != LinkState::Closed;
}

void Link::begin_request(InMsg& m) {
    // m is fresh from new_inbound(): its delivery and pins are reset.
    const Request& req = m.req;
    const bool carries = request_carries_payload(req.opcode);
    m.total = carries ? req.length : 0;
    if (is_multicast_lid(req.dlid)) {
        begin_multicast(m, req);
        return;
    }
    // Only LIDs of this shim's guests are served here.
    if (!eng_->serves(req.dlid)) {
        ++stats.errors;
        m.d.resp.syndrome = Syndrome::Drop;
        m.discard = true;
        return;
    }
    // The peer is trusted for the partitions it says its guest is in, and
    // no others.
    if (!peer_member(req.slid, req.pkey)) {
        ++stats.foreign_pkey;
        LOG_DEBUG("fabric: peer %s: lid %u is not a member of P_Key 0x%04x: request dropped", remote_.c_str(),
                  req.slid, req.pkey);
        m.d.resp.syndrome = Syndrome::Drop;
        m.discard = true;
        return;
    }
    responder_begin(*eng_, req, m.d, &m.pins);
    m.discard = !(m.d.resp.syndrome == Syndrome::Ack && carries && m.d.length);
    if (m.d.resp.syndrome != Syndrome::Ack) {
        responder_finish(m.d);  // error receive completions, if any
        if (m.d.resp.syndrome != Syndrome::Drop && m.d.resp.syndrome != Syndrome::RnrNak) ++stats.errors;
    }
}

// A datagram to a multicast group (multicast_delivery.h): staged here,
// then copied to this worker's members of the group. Only a well-formed
// UD send from a partition its guest is in; anything else is read,
// dropped and never answered.
void Link::begin_multicast(InMsg& m, const Request& req) {
    m.discard = true;
    m.foreign = true;  // not answered, whatever it claims to be
    const bool send = req.opcode == IBV_WR_SEND || req.opcode == IBV_WR_SEND_WITH_IMM;
    if (req.qp_type != IBV_QPT_UD || !send || req.dqpn != kMulticastQpn || req.length > kPortMtuBytes) {
        ++stats.errors;
        return;
    }
    if (!peer_member(req.slid, req.pkey)) {
        ++stats.foreign_pkey;
        return;
    }
    if (!m.staged) m.staged = std::make_unique<uint8_t[]>(kPortMtuBytes);
    m.multicast = true;
    m.discard = m.foreign = false;
    m.d.spans[0] = Span{m.staged.get(), req.length};
    m.d.nspans = 1;
    m.d.length = req.length;
}

void Link::finish_request(InMsg& m) {
    if (m.foreign) return;  // not answered: the LID is not the peer's
    if (m.multicast) {
        if (!m.aborted) multicast_deliver(*eng_, m.req, m.staged.get(), DeliverTo::ThisWorker);
        return;
    }
    const Request& req = m.req;
    Delivery& d = m.d;
    d.resp.tm = is_tm_request(req.opcode);  // a drop decided here too
    if (m.aborted || m.faulted) {
        // A page was lost under the payload: as with the same fault on one
        // shim, the side whose memory it was fails: the requester's
        // (IBV_WC_LOC_PROT_ERR there), or this responder's
        // (IBV_WC_REM_ACCESS_ERR there). The engine ran since the request
        // began: its target is found again first.
        if (d.ctx) responder_revalidate(*eng_, d);
        responder_end(d, m.aborted ? PayloadEnd::RequesterFault : PayloadEnd::ResponderFault);
        if (req.qp_type == IBV_QPT_RC)
            queue_response(req.dlid, req.dqpn, req.slid, req.sqpn, d.resp, false, nullptr, &m.pins);
        return;
    }
    // Only a receive completion is written (a lookup per message saved on
    // every write without one).
    if (d.resp.syndrome == Syndrome::Ack && d.recv_cqe && responder_revalidate(*eng_, d))
        responder_end(d, PayloadEnd::Moved);
    if (req.qp_type != IBV_QPT_RC) return;
    // A drop is answered too (the guest never sees it: its requester treats
    // it as the loss it stands for), so that over a live connection silence
    // only ever means a slow network, never a refused request.
    const bool ack = d.resp.syndrome == Syndrome::Ack;
    const bool read = ack && request_reads(req.opcode);
    const bool plain = ack && request_carries_payload(req.opcode);
    queue_response(req.dlid, req.dqpn, req.slid, req.sqpn, d.resp, plain, read ? &d : nullptr, &m.pins);
}

void Link::begin_response(InMsg& m, const Response& resp, uint64_t length) {
    m.resp = resp;
    m.dst_lid = hdr_.dst_lid;
    m.dst_qpn = hdr_.dst_qpn;
    m.total = length;
    m.discard = true;
    m.local_error = 0;
    m.nspans = 0;
    m.pins.clear();
    if (resp.syndrome != Syndrome::Ack) return;
    QpRef q = eng_->qpns().find(hdr_.dst_lid, hdr_.dst_qpn);
    if (!q || q.qp->type != IBV_QPT_RC || q.qp->attr.ah.dlid != hdr_.src_lid ||
        q.qp->attr.dest_qp_num != hdr_.src_qpn ||
        (q.qp->peer_incarnation && resp.incarnation != q.qp->peer_incarnation))
        return;  // stale, or from another QP with that QPN: nobody waits for this data
    if (!resp.tm && (resp.psn != q.qp->req.una_psn || q.qp->req.sq_next == q.qp->sq.cons)) return;  // stale
    // The ACK of a READ (the requester's, or a rendezvous read:
    // tag_matching.h) must bring exactly the bytes asked for; data for
    // anything else is a bad response.
    uint64_t len = 0;
    uint32_t st = resp.tm ? tm_read_target(*q.ctx, *q.qp, resp.psn, m.spans, m.nspans, len, &m.pins)
                          : requester_read_target(*eng_, *q.ctx, *q.qp, resp.psn, m.spans, m.nspans, len, &m.pins);
    if (st == IBV_WC_LOC_QP_OP_ERR && !length) return;  // not a READ: a plain ACK
    if (st == IBV_WC_SUCCESS && len != length) st = IBV_WC_BAD_RESP_ERR;
    if (st == IBV_WC_LOC_QP_OP_ERR) st = IBV_WC_BAD_RESP_ERR;
    if (st != IBV_WC_SUCCESS) {
        m.local_error = st;
        return;
    }
    m.discard = false;
}

void Link::finish_response(InMsg& m) {
    QpRef q = eng_->qpns().find(m.dst_lid, m.dst_qpn);
    if (!q || q.qp->type != IBV_QPT_RC || q.qp->attr.ah.dlid != m.lid || q.qp->attr.dest_qp_num != m.qpn) return;
    // READ data the responder's shim could not read (kSegAbort), or could
    // not be written here.
    if (!m.local_error && m.aborted) m.local_error = IBV_WC_REM_ACCESS_ERR;
    if (!m.local_error && m.faulted) m.local_error = IBV_WC_LOC_PROT_ERR;
    if (m.resp.tm)
        tm_answered(*eng_, *q.ctx, *q.qp, m.resp, m.local_error);
    else if (m.local_error)
        requester_local_error(*eng_, *q.ctx, *q.qp, m.resp.psn, m.local_error);
    else
        requester_on_response(*eng_, *q.ctx, *q.qp, m.resp);
    m.pins.clear();
}

Link::InMsg* Link::find_inbound(uint8_t type, uint16_t lid, uint32_t qpn) {
    for (auto& m : inbound_)
        if (m->type == type && m->lid == lid && m->qpn == qpn) return m.get();
    return nullptr;
}

Link::InMsg* Link::new_inbound() {
    if (inbound_.size() >= kMaxInbound) return nullptr;
    std::unique_ptr<InMsg> m;
    if (!free_inbound_.empty()) {
        m = std::move(free_inbound_.back());
        free_inbound_.pop_back();
        m->reset();
    } else {
        m = std::make_unique<InMsg>();
    }
    inbound_.push_back(std::move(m));
    return inbound_.back().get();
}

void Link::release_inbound(InMsg* m) {
    for (size_t i = 0; i < inbound_.size(); ++i) {
        if (inbound_[i].get() != m) continue;
        m->pins.clear();
        free_inbound_.push_back(std::move(inbound_[i]));
        inbound_[i] = std::move(inbound_.back());
        inbound_.pop_back();
        return;
    }
}

// ---------------------------------------------------------------------------
// Sending
// ---------------------------------------------------------------------------

QpSender* Link::sender(uint16_t lid, uint32_t qpn, bool create) {
    // (A key's top 16 bits are 0: it is never the map's empty marker.)
    uint64_t k = qp_key(lid, qpn);
    if (last_sender_ && last_sender_->key == k) return last_sender_;
    if (std::unique_ptr<QpSender>* found = senders_.find(k)) return last_sender_ = found->get();
    if (!create) return nullptr;
    std::unique_ptr<QpSender> s;
    if (!idle_senders_.empty()) {
        s = std::move(idle_senders_.back());
        idle_senders_.pop_back();
    } else {
        s = std::make_unique<QpSender>();
    }
    s->key = k;
    s->head = s->count = s->committed = 0;
    s->in_rr = false;
    s->ack_delayed = false;
    s->wake_ctx = 0;

    QpSender* p = s.get();
    senders_.set(k, std::move(s));
    return last_sender_ = p;
}

OutMsg* Link::reserve(QpSender& s, SegType type, uint16_t src_lid, uint32_t src_qpn, uint16_t dst_lid,
                      uint32_t dst_qpn, uint32_t psn) {
    if (s.count == QpSender::kDepth) return nullptr;
    OutMsg& m = s.at(s.count);
    m.type = type;
    m.plain_ack = false;
    m.src_lid = src_lid;
    m.src_qpn = src_qpn;
    m.dst_lid = dst_lid;
    m.dst_qpn = dst_qpn;
    m.psn = psn;
    m.fixed_len = 0;
    m.nspans = 0;
    m.total = 0;
    m.sent = 0;
    m.header_sent = false;
    m.fragile = m.faulted = m.notify_sent = false;
    m.pins.clear();
    return &m;
}

void Link::commit(QpSender& s) {
    ++s.count;
    if (!s.in_rr) {
        s.in_rr = true;
        rr_.push_back(&s);
    }
}

void Link::delay_ack(QpSender& s) {
    if (!ack_delay_ns_ || s.in_rr) {
        commit(s);
        return;
    }
    ++s.count;
    if (!s.ack_delayed) {
        s.ack_delayed = true;
        delayed_acks_.push_back(&s);
    }
    if (!ack_due_ns_) ack_due_ns_ = monotonic_ns() + ack_delay_ns_;
    if (++acks_delayed_ >= kAckDelayMaxMessages) release_acks();
}

void Link::release_acks() {
    for (QpSender* s : delayed_acks_) {
        s->ack_delayed = false;
        if (!s->in_rr && s->committed < s->count) {
            s->in_rr = true;
            rr_.push_back(s);
        }
    }
    delayed_acks_.clear();
    ack_due_ns_ = 0;
    acks_delayed_ = 0;
}

bool Link::send_request(const Request& req, uint64_t ctx_id, const Span* local, uint32_t nlocal,
                        bool inline_payload, Pins* pins) {
    if (state_ != LinkState::Up || close_after_flush_) return false;
    QpSender* s = sender(req.slid, req.sqpn, true);
    // The last slot is kept for the response of the request this QP may be
    // receiving as responder (parse() checked there was room for it).
    OutMsg* m = s->count + 1 < QpSender::kDepth
                    ? reserve(*s, SegType::Request, req.slid, req.sqpn, req.dlid, req.dqpn, req.psn)
                    : nullptr;
    if (!m) {
        s->wake_ctx = ctx_id;
        return false;
    }
    if (req.resend) ++stats.retries;
    m->notify_sent = req.qp_type != IBV_QPT_RC;
    m->sq_idx = req.sq_idx;
    m->fixed_len = encode(req, m->fixed);
    if (request_carries_payload(req.opcode) && req.length) {
        m->total = req.length;
        if (inline_payload) {
            Span dst{m->inline_data, req.length};
            copy_sg(&dst, 1, 0, local, nlocal, req.length);
            m->spans[0] = dst;
            m->nspans = 1;
        } else {
            std::copy(local, local + nlocal, m->spans);
            m->nspans = nlocal;
            if (pins) {
                for (uint32_t i = 0; i < pins->count; ++i) m->pins.keep[i].swap(pins->keep[i]);
                m->pins.count = pins->count;
                pins->count = 0;
            }
            m->fragile = !pins || m->pins.fragile();
        }
    }
    commit(*s);
    ++stats.tx_msgs;
    return true;
}

void Link::send_qp_gone(uint16_t lid, uint32_t qpn, uint16_t peer_lid, uint32_t peer_qpn) {
    if (state_ != LinkState::Up || close_after_flush_) return;
    QpSender* s = sender(lid, qpn, true);
    if (!reserve(*s, SegType::QpGone, lid, qpn, peer_lid, peer_qpn, 0))
        return;  // its queue is full: the peer's timeouts will tell it
    commit(*s);
}

void Link::send_partitions(uint16_t lid, const std::vector<uint16_t>& pkeys) {
    if (state_ != LinkState::Up || close_after_flush_ || pkeys.empty()) return;
    QpSender* s = sender(lid, 0, true);  // QPN 0: no QP of the guest, its own queue
    OutMsg* m = reserve(*s, SegType::Partitions, lid, 0, 0, 0, 0);
    if (!m) return;
    const uint32_t n = uint32_t(std::min<size_t>(pkeys.size(), kMaxPkeys));
    std::memcpy(m->inline_data, pkeys.data(), 2 * n);
    m->spans[0] = Span{m->inline_data, 2 * n};
    m->nspans = 1;
    m->total = 2 * n;
    commit(*s);
}

static_assert(kMaxCmPayload <= abi::kMaxInline, "a CM message travels in an OutMsg's inline bytes");

bool Link::send_cm(uint16_t lid, const uint8_t* msg, size_t len) {
    if (state_ != LinkState::Up || close_after_flush_ || len == 0 || len > kMaxCmPayload) return false;
    QpSender* s = sender(lid, 0, true);  // the guest's own queue, as its partitions
    OutMsg* m = reserve(*s, SegType::Cm, lid, 0, 0, 0, 0);
    if (!m) return false;
    std::memcpy(m->inline_data, msg, len);  // kMaxCmPayload fits kMaxInline
    m->spans[0] = Span{m->inline_data, len};
    m->nspans = 1;
    m->total = len;
    commit(*s);
    return true;
}

bool Link::send_multicast(const Request& req, const uint8_t* payload) {
    if (state_ != LinkState::Up || close_after_flush_ || req.length > kPortMtuBytes) return false;
    QpSender* s = sender(req.slid, req.sqpn, true);
    // As send_request: the last slot stays free for a response.
    OutMsg* m = s->count + 1 < QpSender::kDepth
                    ? reserve(*s, SegType::Request, req.slid, req.sqpn, req.dlid, req.dqpn, req.psn)
                    : nullptr;
    if (!m) return false;
    m->notify_sent = false;  // its WQE completed when the copies were made
    m->fixed_len = encode(req, m->fixed);
    if (req.length) {
        uint8_t* room = m->payload_room(req.length);
        std::memcpy(room, payload, req.length);
        m->spans[0] = Span{room, req.length};
        m->nspans = 1;
        m->total = req.length;
    }
    commit(*s);
    ++stats.tx_msgs;
    return true;
}

void Link::send_ud_qp(uint16_t lid, uint32_t qpn, uint64_t guid) {
    if (state_ != LinkState::Up || close_after_flush_) return;
    QpSender* s = sender(lid, qpn, true);
    OutMsg* m = reserve(*s, SegType::UdQp, lid, qpn, 0, 0, 0);
    if (!m) return;  // its queue is full: its datagrams are not named (HcaDevice::Stats::ud_unknown)
    m->notice = guid;
    commit(*s);
}

void Link::queue_response(uint16_t src_lid, uint32_t src_qpn, uint16_t dst_lid, uint32_t dst_qpn,
                          const Response& resp, bool plain_ack, Delivery* read_from, Pins* pins) {
    QpSender* s = sender(src_lid, src_qpn, true);
    // ACKs are cumulative: one not yet sent for the PSN before this one
    // becomes the ACK of both (a stream of writes is answered by a few ACKs).
    if (plain_ack && s->count > s->committed) {
        OutMsg& last = s->at(s->count - 1);
        if (last.plain_ack && !last.header_sent && last.dst_lid == dst_lid && last.dst_qpn == dst_qpn &&
            psn_next(last.psn) == resp.psn) {
            last.psn = resp.psn;
            WireResponse w = encode(resp, 0);
            std::memcpy(last.fixed, &w, sizeof(w));
            if (s->ack_delayed && ++acks_delayed_ >= kAckDelayMaxMessages) release_acks();
            return;
        }
    }
    OutMsg* m = reserve(*s, SegType::Response, src_lid, src_qpn, dst_lid, dst_qpn, resp.psn);
    if (!m) {  // cannot happen: reading waits for room (parse)
        ++stats.errors;
        return;
    }
    m->plain_ack = plain_ack;
    uint64_t length = read_from ? read_from->length : 0;
    WireResponse w = encode(resp, length);
    std::memcpy(m->fixed, &w, sizeof(w));
    m->fixed_len = sizeof(w);
    if (length) {
        m->total = length;
        std::copy(read_from->spans, read_from->spans + read_from->nspans, m->spans);
        m->nspans = read_from->nspans;
        for (uint32_t i = 0; i < pins->count; ++i) m->pins.keep[i].swap(pins->keep[i]);
        m->pins.count = pins->count;
        pins->count = 0;
        m->fragile = m->pins.fragile();
    }
    if (plain_ack)  // never with READ data (finish_request)
        delay_ack(*s);
    else
        commit(*s);
    ++stats.tx_msgs;
}

bool Link::wants_write() const {
    if (state_ == LinkState::Closed) return false;
    if (!tls_.handshake_done()) return tls_.want_write();
    const bool held = send_frames_ && frames_->output_pending();
    return iov_pos_ < iov_.size() || stage_pos_ < stage_len_ || raw_pos_ < raw_.size() || held ||
           (state_ == LinkState::Up && !rr_.empty());
}

// Gathers one segment of each QP with output in turn (round robin) until
// the batch is full.
void Link::build_batch() {
    // Output goes to the peer now: the ACKs that wait go with it.
    if (!delayed_acks_.empty()) release_acks();
    iov_.clear();
    iov_msg_.clear();
    iov_pos_ = 0;
    seg_hdrs_.clear();
    seg_msg_.clear();
    batch_senders_.clear();
    size_t bytes = 0;
    while (!rr_.empty() && seg_hdrs_.size() < kMaxSegsPerBatch && iov_.size() + abi::kMaxSge + 2 <= kMaxIovPerBatch &&
           bytes < kBatchBytes) {
        QpSender* s = rr_.front();
        rr_.pop_front();
        if (s->committed == s->count) {
            s->in_rr = false;
            continue;
        }
        OutMsg& m = s->at(s->committed);
        SegHeader& h = seg_hdrs_.emplace_back();
        seg_msg_.push_back(&m);
        h = SegHeader{};
        h.type = uint8_t(m.type);
        // A fragile message's payload ends one segment early: an empty last
        // segment follows, to tell whether the payload was whole.
        const bool trailer = m.fragile && m.header_sent && m.sent == m.total;
        uint64_t n = std::min<uint64_t>(kMaxSegmentPayload, m.total - m.sent);
        const bool last = m.sent + n == m.total && (!m.fragile || trailer);
        h.flags = (m.header_sent ? 0 : kSegFirst) | (last ? kSegLast : 0) | (trailer && m.faulted ? kSegAbort : 0);
        h.fixed_len = m.header_sent ? 0 : m.fixed_len;
        h.payload_len = uint32_t(n);
        h.src_lid = m.src_lid;
        h.dst_lid = m.dst_lid;
        h.src_qpn = m.src_qpn;
        h.dst_qpn = m.dst_qpn;
        h.psn = m.psn;
        h.offset = m.type == SegType::UdQp ? m.notice : m.sent;
        iov_.push_back(iovec{&h, sizeof(h)});
        iov_msg_.push_back(nullptr);
        if (!m.header_sent && m.fixed_len) {
            iov_.push_back(iovec{m.fixed, m.fixed_len});
            iov_msg_.push_back(nullptr);
        }
        iovec pieces[abi::kMaxSge];
        size_t k = 0;
        if (m.faulted && n) {
            pieces[k++] = iovec{const_cast<uint8_t*>(kZeros), n};
        } else {
            k = spans_to_iov(m.spans, m.nspans, m.sent, n, pieces, abi::kMaxSge);
        }
        iov_.insert(iov_.end(), pieces, pieces + k);
        for (size_t i = 0; i < k; ++i) iov_msg_.push_back(&m);  // insert(end, k, &m) took ~35 instructions a write
        bytes += sizeof(h) + h.fixed_len + n;
        // Guests' payload only: what the shim's CPU copies of their memory
        // (a refusal's text and a P_Key table are the shim's own).
        if (m.type == SegType::Request || m.type == SegType::Response) stats.tx_payload += n;
        m.header_sent = true;
        m.sent += n;
        if (std::find(batch_senders_.begin(), batch_senders_.end(), s) == batch_senders_.end())
            batch_senders_.push_back(s);
        if (last) ++s->committed;
        if (s->committed < s->count)
            rr_.push_back(s);
        else
            s->in_rr = false;
    }
}

// The batch is written: the messages it finished leave their queues.
void Link::batch_done() {
    bool room = false;
    for (QpSender* s : batch_senders_) {
        for (; s->committed > 0; --s->committed) {
            if (s->at(0).notify_sent) notify_sent(s->at(0));
            s->at(0).pins.clear();
            s->at(0).large.reset();  // a multicast payload's room goes with it
            s->head = (s->head + 1) % QpSender::kDepth;
            --s->count;
            room = true;
        }
        if (s->wake_ctx && s->count < QpSender::kDepth) {
            if (Context* c = eng_->find_context(s->wake_ctx)) c->request_rescan();
            s->wake_ctx = 0;
        }
    }
    // A queue left empty goes back to the pool: QPs come and go, the map
    // holds only those with output.
    for (QpSender* s : batch_senders_) {
        if (s->count || s->in_rr || s->ack_delayed || s->wake_ctx) continue;
        std::unique_ptr<QpSender>* queue = senders_.find(s->key);
        if (!queue) continue;
        if (last_sender_ == s) last_sender_ = nullptr;
        if (idle_senders_.size() < 16) idle_senders_.push_back(std::move(*queue));  // about 2 MiB kept
        senders_.erase(s->key);
    }
    batch_senders_.clear();
    iov_.clear();
    iov_msg_.clear();
    iov_pos_ = 0;
    if (room && paused_) {
        paused_ = false;
        on_readable();  // what waited in the receive buffer
    }
}

// A page of guest memory vanished (its guest truncated the file behind an
// MR) at the first iovec not yet written. If that is the payload of a
// fragile message, the message goes on with zeros in its place and its
// last segment says it is void (kSegAbort); every other message, and the
// link, go on. False: not guest payload (a real error).
bool Link::write_fault() {
    if (iov_pos_ >= iov_.size()) return false;
    OutMsg* m = iov_msg_[iov_pos_];
    if (!m || !m->fragile) return false;
    if (!m->faulted) {
        m->faulted = true;
        LOG_DEBUG("fabric: peer %s: lid %u QPN %u: a page of the payload of PSN %u vanished", remote_.c_str(),
                  m->src_lid, m->src_qpn, m->psn);
        // READ data from this responder's memory: the QP fails as it would
        // on one shim (responder_memory_fault).
        if (m->type == SegType::Response)
            if (QpRef q = eng_->qpns().find(m->src_lid, m->src_qpn); q && q.qp->type == IBV_QPT_RC)
                qp_set_error(*q.ctx, *q.qp, IBV_EVENT_QP_ACCESS_ERR);
    }
    for (size_t k = iov_pos_; k < iov_.size(); ++k)
        if (iov_msg_[k] == m) iov_[k].iov_base = const_cast<uint8_t*>(kZeros);
    for (size_t j = 0; j < seg_hdrs_.size(); ++j)
        if (seg_msg_[j] == m && (seg_hdrs_[j].flags & kSegLast)) seg_hdrs_[j].flags |= kSegAbort;
    return true;
}

// The target memory of the incoming message lost a page: the rest of its
// payload is read and dropped, and the message fails when it ends.
void Link::target_fault() {
    cur_->faulted = true;
    cur_->discard = true;
}

// Copies the batch's next pieces into the staging buffer, up to the first
// one that goes straight from guest memory (long, and not fragile).
void Link::fill_stage() {
    while (iov_pos_ < iov_.size() && stage_len_ < stage_.size()) {
        iovec& v = iov_[iov_pos_];
        if (v.iov_len == 0) {
            ++iov_pos_;
            continue;
        }
        OutMsg* m = iov_msg_[iov_pos_];
        const bool guarded = m && m->fragile && !m->faulted;
        if (v.iov_len >= kDirectWriteMin && !guarded) break;
        const size_t take = std::min(v.iov_len, stage_.size() - stage_len_);
        if (guarded) {
            uintptr_t fault = 0;
            if (!guarded_memmove(stage_.data() + stage_len_, v.iov_base, take, &fault)) {
                write_fault();  // the rest of this message goes as zeros, the message is void
                continue;
            }
        } else {
            std::memcpy(stage_.data() + stage_len_, v.iov_base, take);
        }
        stage_len_ += take;
        v.iov_base = static_cast<uint8_t*>(v.iov_base) + take;
        v.iov_len -= take;
        if (v.iov_len == 0) ++iov_pos_;
    }
}

bool Link::flush() {
    if (state_ == LinkState::Closed) return false;
    if (!drive_handshake()) return wants_write();
    write_batches();
    if (state_ == LinkState::Closed) return false;
    // What the channel holds back to send in one call goes now.
    if (flush_channel() < 0) return false;
    if (close_after_flush_ && !wants_write()) {
        close(close_reason_);
        return false;
    }
    return wants_write();
}

void Link::write_batches() {
    // Bounded: a link never holds the shim's thread for long (and a
    // zero-progress write can never spin it).
    for (int round = 0; round < 64 && state_ != LinkState::Closed; ++round) {
        if (raw_pos_ < raw_.size()) {
            // The Hello alone in its record (the frames start right after it).
            const size_t end = hello_sent_ ? raw_.size() : sizeof(Hello);
            ssize_t n = send_bytes(raw_.data() + raw_pos_, end - raw_pos_);
            if (n <= 0) return;
            raw_pos_ += size_t(n);
            if (raw_pos_ == sizeof(Hello) && !hello_sent_) {
                hello_sent_ = true;
                // (The TLS channel writes straight to the socket, so the
                // Hello is out before the first frame.)
                if (!frames_ && !start_frames()) return;
                send_frames_ = true;
            }
            if (raw_pos_ == raw_.size()) {
                raw_.clear();
                raw_pos_ = 0;
            }
            continue;
        }
        if (stage_pos_ < stage_len_) {
            ssize_t n = send_bytes(stage_.data() + stage_pos_, stage_len_ - stage_pos_);
            if (n <= 0) return;
            stage_pos_ += size_t(n);
            if (stage_pos_ == stage_len_) stage_pos_ = stage_len_ = 0;
            continue;
        }
        if (iov_pos_ < iov_.size()) {
            iovec& v = iov_[iov_pos_];
            OutMsg* m = iov_msg_[iov_pos_];
            if (v.iov_len >= kDirectWriteMin && !(m && m->fragile && !m->faulted)) {
                ssize_t n = send_bytes(v.iov_base, v.iov_len);
                if (n <= 0) return;
                v.iov_base = static_cast<uint8_t*>(v.iov_base) + n;
                v.iov_len -= size_t(n);
                if (v.iov_len == 0) ++iov_pos_;
            } else {
                fill_stage();
            }
            // Every piece is out or copied: the messages may leave their
            // queues (the staged bytes are written first, in order).
            if (iov_pos_ == iov_.size()) batch_done();
            continue;
        }
        if (close_after_flush_ || state_ != LinkState::Up || rr_.empty()) return;
        build_batch();
        if (iov_.empty()) return;
    }
}

}  // namespace vrdma::shim::fabric
