#include "load_report.h"

#include <cstdio>
#include <map>

namespace vrdma::shim {
namespace {

double seconds(uint64_t ns) { return double(ns) / 1e9; }

size_t live_guests(const Engine& eng) {
    size_t n = 0;
    for (auto& g : eng.guests()) n += !g->removed;
    return n;
}

}  // namespace

void load_report(Engine& eng, uint32_t worker, uint64_t asleep_ns, uint64_t uptime_ns, std::string& workers,
                 std::string& guests) {
    std::map<const GuestIdentity*, unsigned> contexts;
    eng.for_each_context([&](Context& ctx) { ++contexts[&ctx.guest()]; });
    char line[256];
    const WorkerLoad& w = eng.turns().worker_load();
    std::snprintf(line, sizeof(line), "worker %u guests %zu contexts %zu passes %llu busy_s %.3f asleep_s %.3f uptime_s %.3f\n",
                  worker, live_guests(eng), eng.context_count(), (unsigned long long)w.passes, seconds(w.busy_ns),
                  seconds(asleep_ns), seconds(uptime_ns));
    workers += line;
    for (auto& g : eng.guests()) {
        if (g->removed) continue;
        const GuestLoad& l = g->load;
        auto it = contexts.find(g.get());
        std::snprintf(line, sizeof(line),
                      "guest %s contexts %u turns %llu messages %llu bytes %llu busy_s %.3f qp_visits %llu worker %u "
                      "weight %u yields %llu\n",
                      g->name.c_str(), it == contexts.end() ? 0u : it->second, (unsigned long long)l.turns,
                      (unsigned long long)l.messages, (unsigned long long)l.bytes, seconds(l.busy_ns),
                      (unsigned long long)l.qp_visits, worker, g->weight, (unsigned long long)l.yields);
        guests += line;
    }
}

}  // namespace vrdma::shim
