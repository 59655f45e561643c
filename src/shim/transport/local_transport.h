// The local transport: both ends are guests of this shim. The requester and
// the responder run in one process; the payload moves with one memcpy
// between the two guests' memory mappings (no bounce buffer), and the
// response is known at once (nothing is ever left in flight).
#pragma once

#include "transport.h"

namespace vrdma::shim {

class LocalTransport final : public Transport {
public:
    const char* name() const override { return "local"; }
    SendResult send(Engine& eng, Context& ctx, Qp& qp, const Request& req, const Span* local, uint32_t nlocal,
                    Pins* pins, Response& resp) override;
};

}  // namespace vrdma::shim
