#include "multicast_delivery.h"

#include <algorithm>
#include <array>

#include "engine.h"
#include "multicast_groups.h"
#include "transport.h"

namespace vrdma::shim {

namespace {
// The other workers a datagram goes to, each once (at most one per worker
// of the shim; a shim runs at most 64).
constexpr size_t kMaxLinks = 64;
}  // namespace

uint32_t multicast_deliver(Engine& eng, const Request& req, const uint8_t* payload, DeliverTo to) {
    const McastView& view = eng.multicast_view();
    Request copy = req;
    copy.inline_payload = true;
    copy.fan_out = true;
    copy.wqe = nullptr;
    std::array<Transport*, kMaxLinks> links;
    size_t nlinks = 0;
    uint32_t went = 0;
    view.for_each_member(req.dlid, req.grh ? req.dgid : nullptr, [&](const McastMember& m) {
        Transport* t = eng.routes().lookup(m.lid);
        if (!t || !t->within_shim()) return;  // a guest that left: its QPs leave with it
        if (!eng.is_here(t)) {
            // Another worker's guest: that worker gets the datagram once
            // and copies it to its own members (WorkerLink::on_request).
            if (to == DeliverTo::WholeShim && nlinks < kMaxLinks &&
                std::find(links.begin(), links.begin() + nlinks, t) == links.begin() + nlinks)
                links[nlinks++] = t;
            return;
        }
        copy.dlid = m.lid;
        copy.dqpn = m.qpn;
        went += t->send_copy(eng, copy, payload) ? 1 : 0;
        eng.turns().charge(TurnScheduler::kWqeCost + req.length);
    });
    copy.dlid = req.dlid;  // the group's address: the other worker looks its members up
    copy.dqpn = req.dqpn;
    for (size_t i = 0; i < nlinks; ++i) {
        went += links[i]->send_copy(eng, copy, payload) ? 1 : 0;
        eng.turns().charge(TurnScheduler::kWqeCost + req.length);
    }
    return went;
}

void multicast_send(Engine& eng, const Request& req, const uint8_t* payload) {
    multicast_deliver(eng, req, payload, DeliverTo::WholeShim);
    if (MulticastForwarder* f = eng.multicast_forwarder()) f->forward_multicast(eng, req, payload);
}

}  // namespace vrdma::shim
