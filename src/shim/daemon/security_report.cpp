#include "security_report.h"

#include <cstdio>

namespace vrdma::shim {

void security_report(Engine& eng, std::string& guests, std::string& qps) {
    char line[256];
    for (auto& g : eng.guests()) {
        if (g->removed) continue;
        const GuestSecurity& s = g->security;
        std::snprintf(line, sizeof(line),
                      "guest %s remote_access_errors %llu stranger_requests %llu pkey_violations %llu "
                      "refused_connections %llu throttled_requests %llu qkey_violations %llu "
                      "throttled_datagrams %llu\n",
                      g->name.c_str(), (unsigned long long)s.remote_access_errors,
                      (unsigned long long)s.stranger_requests, (unsigned long long)s.pkey_violations,
                      (unsigned long long)s.refused_connections, (unsigned long long)s.throttled_requests,
                      (unsigned long long)s.qkey_violations, (unsigned long long)s.throttled_datagrams);
        guests += line;
    }
    eng.for_each_context([&](Context& ctx) {
        ctx.qps.for_each([&](uint32_t, Qp& qp) {
            if (!qp.remote_access_errors && !qp.stranger_requests) return;
            std::snprintf(line, sizeof(line), "qp %s 0x%06x remote_access_errors %llu stranger_requests %llu\n",
                          ctx.guest().name.c_str(), qp.qpn, (unsigned long long)qp.remote_access_errors,
                          (unsigned long long)qp.stranger_requests);
            qps += line;
        });
    });
}

}  // namespace vrdma::shim
