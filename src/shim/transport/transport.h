// The interface every transport implements (docs/architecture.md "The
// transport contract").
// The requester (requester.h) builds a Request from a send WQE, resolves the
// sender's memory into spans and hands both to the transport bound to the
// QP (RC: the route of its destination LID; UD: of each datagram's). The
// transport delivers the request to a responder (responder.h): in this
// shim (local) or in the peer shim that owns the destination LID (tcp).
#pragma once

#include <cstdint>

#include "device_model.h"
#include "request.h"
#include "resources.h"
#include "vrdma/abi.h"
#include "work_queue.h"

namespace vrdma::shim {

class Engine;
class Context;

struct SendWork;

// What a transport that carries a QP did with its BIND_MW or LOCAL_INV
// (Transport::post_local_op).
enum class LocalOp {
    Shim,    // nothing for the transport: the shim's view is all, it completes now
    Posted,  // posted: it completes through the transport
    Failed,  // the transport could not take it: the WQE fails
};

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

    // --- The guest's objects ---------------------------------------------
    // A transport that keeps objects of its own beside the guest's (a
    // device's PD, MRs, windows, SRQs and QPs: hca_bind.h) makes and
    // changes them here, as the command handlers make and change the
    // guest's, into the guest object's slot for them (resources.h), which
    // goes with the guest object. The command handlers call every
    // transport the engine keeps objects for (Engine::object_keepers) and
    // name none. Errors are errnos that fail the command.

    // The GID of this shim's own device, for a keeper that is one (a
    // peer shim learns it in the fabric's Hello: hca_bind.h).
    virtual const uint8_t* own_device_gid() const { return nullptr; }
    // What the guest's device offers, with this transport in the shim.
    virtual void limit_device(abi::DeviceAttr& a) const { (void)a; }
    virtual int pd_made(Engine& eng, Pd& pd) {
        (void)eng, (void)pd;
        return 0;
    }
    // Its MR for `mr` (new, or `rereg`: instead of the one it has), with
    // the memory, addresses and access `shape` gives, into `made`, and the
    // key the MR must take in `key` (0: none made). The command puts `made`
    // in mr.kept once the key is the MR's.
    struct MrShape {
        uint8_t* host = nullptr;
        uint64_t length = 0;
        uint64_t iova = 0;
        uint32_t access = 0;
    };
    virtual int mr_made(Engine& eng, const Pd& pd, const Mr& mr, const MrShape& shape, bool rereg,
                        Kept& made, uint32_t& key) {
        (void)eng, (void)pd, (void)mr, (void)shape, (void)rereg, (void)made, (void)key;
        return 0;
    }
    // Its window of `type` in `pd` (none: `made` stays empty), its rkey in `key`.
    virtual void mw_made(Engine& eng, const Pd& pd, uint32_t type, Kept& made, uint32_t& key) {
        (void)eng, (void)pd, (void)type, (void)made, (void)key;
    }
    // A basic SRQ of `pd` (srq.wq and srq.max_sge set).
    virtual void srq_made(Engine& eng, const Pd& pd, Srq& srq) { (void)eng, (void)pd, (void)srq; }
    // A QP of type `r.qp_type` (not XRC) in `pd`, on `srq` if not null:
    // the QPN it must take (its own QP's), or 0.
    virtual uint32_t qp_made(Engine& eng, const Pd& pd, const Srq* srq, Qp& qp, const abi::CmdCreateQpReq& r) {
        (void)eng, (void)pd, (void)srq, (void)qp, (void)r;
        return 0;
    }
    // ModifyQp to `next`, the new attributes in qp.attr, before the guest
    // QP changes state: the transport may take the QP (qp.transport) or
    // refuse the change.
    virtual int qp_moving(Engine& eng, Context& ctx, Qp& qp, uint32_t next) {
        (void)eng, (void)ctx, (void)qp, (void)next;
        return 0;
    }
    // A QP this transport carries entered the error state.
    virtual void qp_failed(Qp& qp) { (void)qp; }
    // A datagram for a UD QP this transport carries, whose receives it
    // holds, came another way: it is lost (and counted).
    virtual void datagram_missed(const Qp& qp) { (void)qp; }

    // --- A QP this transport carries whole (Qp::carried) -----------------
    // Every pass of the requester over a QP, carried or not (a keeper
    // binds a QP whose route now leads through it, and takes the receives
    // the guest posted).
    virtual void qp_pass(Engine& eng, Context& ctx, Qp& qp) { (void)eng, (void)ctx, (void)qp; }
    // Whether it posts WQEs of ibv_wr_opcode `op` (false: such a WQE fails
    // with IBV_WC_LOC_QP_OP_ERR).
    virtual bool carries_opcode(uint32_t op) const {
        (void)op;
        return true;
    }
    // Whether a datagram of the QP to (dlid, dqpn) goes through it;
    // otherwise it goes by the route of dlid.
    virtual bool carries_datagram(Engine& eng, uint16_t dlid, uint32_t dqpn) {
        (void)eng, (void)dlid, (void)dqpn;
        return false;
    }
    // The largest datagram it carries.
    virtual uint64_t datagram_mtu() const { return kPortMtuBytes; }
    // BIND_MW or LOCAL_INV `w` of the QP, on window `mw` (null: none is
    // named). check_local_op, before the shim applies it to its own view
    // of the window: IBV_WC_SUCCESS or the status it fails with.
    // post_local_op, once it has.
    virtual uint32_t check_local_op(const Qp& qp, const Mw* mw, bool bind) const {
        (void)qp, (void)mw, (void)bind;
        return 0;  // IBV_WC_SUCCESS
    }
    virtual LocalOp post_local_op(Engine& eng, Context& ctx, Qp& qp, Mw* mw, SendWork& w, bool bind) {
        (void)eng, (void)ctx, (void)qp, (void)mw, (void)w, (void)bind;
        return LocalOp::Shim;
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
