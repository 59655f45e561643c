// Multicast datagrams (docs/protocol.md "Multicast"). The sender's payload
// is gathered once into the engine's multicast buffer (requester.cpp); a
// copy goes from there to every member QP of the group among this worker's
// guests (LocalTransport::send_copy), one datagram to every other worker
// with members (its WorkerLink::send_copy; that worker copies it to its own
// members), and one to every peer worker of the fabric (MulticastForwarder),
// which does the same for its own members. Each copy is a datagram like any other: the
// member's responder checks its state, Q_Key and partition and takes a
// receive, or drops it.
#pragma once

#include <cstdint>

#include "request.h"

namespace vrdma::shim {

class Engine;

// From a guest of this shim: to this shim's members and to the peers.
void multicast_send(Engine& eng, const Request& req, const uint8_t* payload);

// Which members a copy goes to: every one of this shim's (the sender's
// worker), or only those of the worker whose engine `eng` is (a datagram
// from a peer shim: each worker of this shim got its own from the peer's
// worker, over their own link).
enum class DeliverTo { WholeShim, ThisWorker };
// Returns the copies that went.
uint32_t multicast_deliver(Engine& eng, const Request& req, const uint8_t* payload, DeliverTo to);

}  // namespace vrdma::shim
