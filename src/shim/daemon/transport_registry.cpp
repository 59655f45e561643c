#include "transport_registry.h"

#include "fabric_plugin.h"
#include "hca_plugin.h"

namespace vrdma::shim {

// In this order their options appear in --help, their lines in vrdmactl
// transports and their words on the ready line.
const std::vector<const TransportFactory*>& transport_factories() {
    static const std::vector<const TransportFactory*> all = {
        &fabric::factory(),  // TCP to peer shims (--fabric-*)
        &hca_factory(),      // a real RDMA device (--hca)
    };
    return all;
}

const TransportOption* find_transport_option(const std::string& name) {
    for (const TransportFactory* f : transport_factories())
        for (const TransportOption& o : f->options)
            if (name == o.name) return &o;
    return nullptr;
}

}  // namespace vrdma::shim
