// The local transport: both ends are guests of this shim. The requester and
// the responder run in one process; the payload moves with one memcpy
// between the two guests' memory mappings (no bounce buffer).
//
// A message up to TurnScheduler::kSliceBytes moves at once and its response is
// known when send() returns. A larger one moves kSliceBytes at a time while
// the context's turn lasts (engine.h, protocol.md "Work per turn"), so that
// no transfer holds the shim for much longer than a turn: send() answers
// Busy until the last slice, the requester offers the same WQE again on the
// next pass, and the copy goes on where it stopped. Both sides' mappings
// are pinned meanwhile (the guests may deregister the memory; the bytes
// then land in pages nobody uses, never in unmapped memory).
#pragma once

#include "transport.h"

namespace vrdma::shim {

class LocalTransport final : public Transport {
public:
    const char* name() const override { return "local"; }
    SendResult send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local, uint32_t nlocal,
                    Pins* pins, Response& resp) override;

    // `qp` stops a large transfer it was moving (sliced_transfer.h): a
    // receive the transfer took completes with IBV_WC_REM_ABORT_ERR and the
    // responder QP goes to error, as when a peer shim goes away mid-message.
    void abandon(Engine& eng, Qp& qp) override;
    // A multicast copy to a guest of this worker: delivered now.
    bool send_copy(Engine& eng, const Request& req, const uint8_t* payload) override;

    // With --hca-local, this host's RC and UC traffic goes through the
    // device too, as to a peer shim with that GID (hca_bind.h).
    bool within_shim() const override { return true; }
    const uint8_t* device_gid() const override { return device_gid_; }
    void set_device_gid(const uint8_t* gid) { device_gid_ = gid; }

    // Payload bytes copied between guests (vrdmactl transports).
    uint64_t copied_bytes() const { return copied_bytes_; }

private:
    uint64_t copied_bytes_ = 0;
    const uint8_t* device_gid_ = nullptr;
};

}  // namespace vrdma::shim
