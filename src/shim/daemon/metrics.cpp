#include "metrics.h"

#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "quota.h"

namespace vrdma::shim {
namespace {

struct Family {
    const char* type;
    const char* help;
};

// The families of the shim's own samples, with their type and help (the
// transports give theirs: TransportPlugin::metric_families).
const std::map<std::string, Family>& families() {
    static const std::map<std::string, Family> f = {
        {"vrdma_up", {"gauge", "1 while the shim serves its guests."}},
        {"vrdma_uptime_seconds", {"gauge", "Seconds since the shim started."}},
        {"vrdma_worker_guests", {"gauge", "Guests served by the worker."}},
        {"vrdma_worker_contexts", {"gauge", "Attached contexts (processes' devices) on the worker."}},
        {"vrdma_worker_passes_total", {"counter", "Passes of the worker over its contexts."}},
        {"vrdma_worker_busy_seconds_total", {"counter", "Time the worker spent in turns that found work."}},
        {"vrdma_worker_asleep_seconds_total", {"counter", "Time the worker slept with nothing to do."}},
        {"vrdma_guest_contexts", {"gauge", "Attached contexts of the guest."}},
        {"vrdma_guest_resources", {"gauge", "What the guest's contexts hold, by kind (the --quota keys)."}},
        {"vrdma_guest_resource_limit", {"gauge", "The guest's quota, by kind (--quota)."}},
        {"vrdma_guest_quota_refusals_total", {"counter", "Requests refused because they would pass a quota."}},
        {"vrdma_guest_weight", {"gauge", "The guest's share of its worker (vrdma-shim --guest NAME:weight=W)."}},
        {"vrdma_guest_turns_total", {"counter", "Turns of the guest's contexts that found work."}},
        {"vrdma_guest_messages_total", {"counter", "Messages the guest's QPs sent, resends not counted."}},
        {"vrdma_guest_bytes_total", {"counter", "Payload bytes the guest's QPs sent, resends not counted."}},
        {"vrdma_guest_busy_seconds_total", {"counter", "Time the worker spent in the guest's turns."}},
        {"vrdma_guest_remote_access_errors_total",
         {"counter", "Requests to the guest's QPs with an rkey, range or access they do not grant."}},
        {"vrdma_guest_stranger_requests_total",
         {"counter", "Requests to the guest's QPs from a QP other than the connected one, dropped."}},
        {"vrdma_guest_pkey_violations_total",
         {"counter", "Requests and datagrams to the guest from outside its partitions, dropped."}},
        {"vrdma_guest_refused_connections_total",
         {"counter", "Connections to the guest's socket by users who may not use it."}},
        {"vrdma_guest_throttled_requests_total",
         {"counter", "RDMA and atomic requests dropped from sources that keep guessing keys."}},
        {"vrdma_guest_qkey_violations_total", {"counter", "UD datagrams to the guest with a wrong qkey, dropped."}},
        {"vrdma_guest_throttled_datagrams_total",
         {"counter", "UD datagrams dropped unexamined from sources that keep guessing the guest's qkeys."}},
    };
    return f;
}

template <typename V>
void add(std::string& out, const char* name, const std::string& labels, V value) {
    add_sample(out, name, labels, value);
}

}  // namespace

void metrics_samples(Engine& eng, uint32_t worker, uint64_t asleep_ns, std::string& out) {
    std::map<const GuestIdentity*, uint64_t> contexts;
    eng.for_each_context([&](Context& ctx) { ++contexts[&ctx.guest()]; });
    const std::string wl = "worker=\"" + std::to_string(worker) + "\"";
    uint64_t guests = 0;
    for (auto& g : eng.guests()) guests += !g->removed;
    add(out, "vrdma_worker_guests", wl, guests);
    add(out, "vrdma_worker_contexts", wl, uint64_t(eng.context_count()));
    add(out, "vrdma_worker_passes_total", wl, eng.turns().worker_load().passes);
    add(out, "vrdma_worker_busy_seconds_total", wl, seconds(eng.turns().worker_load().busy_ns));
    add(out, "vrdma_worker_asleep_seconds_total", wl, seconds(asleep_ns));
    for (auto& g : eng.guests()) {
        if (g->removed) continue;
        const std::string gl = "guest=\"" + label_value(g->name) + "\"";
        const std::string gwl = gl + "," + wl;
        const GuestLoad& l = g->load;
        auto it = contexts.find(g.get());
        add(out, "vrdma_guest_contexts", gwl, it == contexts.end() ? uint64_t(0) : it->second);
        if (const GuestUsage* u = eng.guests().usage_of(*g)) {
            for (unsigned r = 0; r < kResCount; ++r) {
                const std::string kl = gl + ",kind=\"" + res_key(Res(r)) + "\"";
                add(out, "vrdma_guest_resources", kl, u->used(Res(r)));
                add(out, "vrdma_guest_resource_limit", kl, u->limit(Res(r)));
            }
            add(out, "vrdma_guest_quota_refusals_total", gl, u->refusals());
        }
        add(out, "vrdma_guest_weight", gwl, uint64_t(g->weight));
        add(out, "vrdma_guest_turns_total", gwl, l.turns);
        add(out, "vrdma_guest_messages_total", gwl, l.messages);
        add(out, "vrdma_guest_bytes_total", gwl, l.bytes);
        add(out, "vrdma_guest_busy_seconds_total", gwl, seconds(l.busy_ns));
        const GuestSecurity& s = g->security;
        add(out, "vrdma_guest_remote_access_errors_total", gl, s.remote_access_errors);
        add(out, "vrdma_guest_stranger_requests_total", gl, s.stranger_requests);
        add(out, "vrdma_guest_pkey_violations_total", gl, s.pkey_violations);
        add(out, "vrdma_guest_refused_connections_total", gl, s.refused_connections);
        add(out, "vrdma_guest_throttled_requests_total", gl, s.throttled_requests);
        add(out, "vrdma_guest_qkey_violations_total", gl, s.qkey_violations);
        add(out, "vrdma_guest_throttled_datagrams_total", gl, s.throttled_datagrams);
    }
}

std::string metrics_exposition(const std::string& samples, uint64_t uptime_ns, const std::vector<MetricFamily>& more) {
    std::map<std::string, std::vector<std::string>> by_family;
    std::string all = samples;
    add(all, "vrdma_up", "", uint64_t(1));
    add(all, "vrdma_uptime_seconds", "", seconds(uptime_ns));
    std::istringstream in(all);
    for (std::string line; std::getline(in, line);) {
        const size_t a = line.find('\t'), b = line.find('\t', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string name = line.substr(0, a), labels = line.substr(a + 1, b - a - 1);
        by_family[name].push_back(name + (labels.empty() ? "" : "{" + labels + "}") + " " + line.substr(b + 1));
    }
    std::string text;
    for (const auto& [name, lines] : by_family) {
        Family fam{nullptr, nullptr};
        if (auto f = families().find(name); f != families().end()) fam = f->second;
        for (const MetricFamily& m : more)
            if (name == m.name) fam = Family{m.type, m.help};
        if (fam.type)
            text += "# HELP " + name + " " + fam.help + "\n# TYPE " + name + " " + fam.type + "\n";
        for (const std::string& l : lines) text += l + "\n";
    }
    return text;
}

std::string metrics_http_response(const std::string& head, const std::function<std::string()>& body) {
    auto reply = [](const char* status, const std::string& type, const std::string& content, bool with_body) {
        return std::string("HTTP/1.0 ") + status + "\r\nContent-Type: " + type +
               "\r\nContent-Length: " + std::to_string(content.size()) + "\r\nConnection: close\r\n\r\n" +
               (with_body ? content : std::string());
    };
    const size_t eol = head.find("\r\n");
    std::istringstream line(head.substr(0, eol));
    std::string method, target, version;
    line >> method >> target >> version;
    if (method.empty() || target.empty() || version.rfind("HTTP/1.", 0) != 0)
        return reply("400 Bad Request", "text/plain", "not an HTTP request\n", true);
    if (method != "GET" && method != "HEAD")
        return reply("405 Method Not Allowed", "text/plain", "only GET /metrics\n", true);
    const std::string path = target.substr(0, target.find('?'));
    if (path != "/metrics") return reply("404 Not Found", "text/plain", "only /metrics is here\n", method == "GET");
    return reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", body(), method == "GET");
}

}  // namespace vrdma::shim
