// The interface every transport implements (docs/architecture.md "The
// transport contract").
// The requester (requester.h) builds a Request from a send WQE, resolves the
// sender's memory into spans and hands both to the transport bound to the
// QP (RC: the route of its destination LID; UD: of each datagram's). The
// transport delivers the request to a responder (responder.h): in this
// shim (local) or in the peer shim that owns the destination LID (tcp).
#pragma once

#include <cstdint>

#include "request.h"
#include "work_queue.h"

namespace vrdma::shim {

class Engine;
class Context;
struct Qp;

enum class SendResult {
    Done,      // the response is in `resp` and the payload has moved (local)
    InFlight,  // taken: the response arrives later through requester_on_response
    Busy,      // not taken now (back-pressure): the requester tries again later
};

class Transport {
public:
    virtual ~Transport() = default;
    virtual const char* name() const = 0;

    // True if the transport keeps the sender's memory after send()
    // returns (it writes the payload later): the requester then pins it.
    virtual bool keeps_memory() const { return false; }

    // Carries `req` of `qp`. `local` is the sender's memory: the payload of
    // SEND and WRITE (gathered), the destination of READ data (scattered);
    // when req.inline_payload it lives in the requester's scratch memory
    // and is gone once send() returns. `pins` (keeps_memory() only) holds
    // the mappings of `local`; the transport may take them.
    // UD requests get no response: Done and InFlight both mean "sent".
    virtual SendResult send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local,
                            uint32_t nlocal, Pins* pins, Response& resp) = 0;

    // True if the other end is known to be alive and delivering (the
    // request that has waited since `since_ns` is in a reliable stream that
    // is still moving): a request with no response after the QP's timeout
    // is then late, not lost, and the requester waits another timeout
    // without spending a retry. Transports that can lose a request
    // silently answer false.
    virtual bool delivering_since(uint64_t since_ns) const {
        (void)since_ns;
        return false;
    }

    // Carries a copy of datagram `req` whose payload (req.length bytes at
    // `payload`, at most the port MTU) is the shim's own and whose sender
    // waits for nothing (req.fan_out, multicast_delivery.h): to one member
    // QP (the local transport), or, addressed to the group, to another
    // worker for its members (a worker link). False if it did not go: the
    // copy is lost, as a datagram may be. A peer shim gets its datagram
    // through the MulticastForwarder.
    virtual bool send_copy(Engine& eng, const Request& req, const uint8_t* payload) {
        (void)eng, (void)req, (void)payload;
        return false;
    }

    // `qp` stops the transfer in slices this transport was moving for it
    // (sliced_transfer.h).
    virtual void abandon(Engine& eng, Qp& qp) {
        (void)eng, (void)qp;
    }

    // True if the transport reaches guests of this shim (the local
    // transport, a link to another worker).
    virtual bool within_shim() const { return false; }

    // The device GID of the shim this transport reaches when that shim and
    // this one both have an RDMA device (hca_bind.h); null otherwise.
    virtual const uint8_t* device_gid() const { return nullptr; }

    // RC QP (lid, qpn), connected to (peer_lid, peer_qpn) which this
    // transport reaches, vanished with its process (or failed its peer:
    // Engine::fail_responder_of): the peer QP goes to error at once with
    // `event` rather than wait for a timeout (protocol.md). A transport
    // that cannot carry the event raises QP_FATAL.
    virtual void qp_gone(uint16_t lid, uint32_t qpn, uint16_t peer_lid, uint32_t peer_qpn,
                         int event = IBV_EVENT_QP_FATAL) {
        (void)lid, (void)qpn, (void)peer_lid, (void)peer_qpn, (void)event;
    }
};

// The UD QPs on the devices of the peer shims (the fabric: fabric.h), for
// UD through the device (hca_ud.h): a device delivers a datagram with the
// sending shim's device GID and the QPN, and only that shim knows which of
// its guests owns the QPN.
class UdDirectory {
public:
    virtual ~UdDirectory() = default;
    // Tells every peer shim with a device that QP `qpn` of this shim's guest
    // (lid, port GUID) is a UD QP on this shim's device.
    virtual void announce_ud(uint16_t lid, uint32_t qpn, uint64_t guid) = 0;
    // The guest of the peer shim with device GID `gid` whose UD QP on that
    // device is `qpn`; false if no peer announced it.
    virtual bool ud_owner(const uint8_t* gid, uint32_t qpn, uint16_t& lid, uint64_t& guid) const = 0;
};

// Multicast datagrams to the peer shims (the fabric: fabric.h). A datagram
// to a multicast LID goes once to every peer shim that is up, which copies
// it to its own members of the group and sends it no further.
class MulticastForwarder {
public:
    virtual ~MulticastForwarder() = default;
    // `req`: the datagram (dlid the MLID, dqpn kMulticastQpn); its payload
    // is req.length bytes at `payload`, valid only during the call. Each
    // datagram sent is charged to `eng`'s turn.
    virtual void forward_multicast(Engine& eng, const Request& req, const uint8_t* payload) = 0;
};

}  // namespace vrdma::shim
