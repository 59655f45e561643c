// The shim's counters for Prometheus (vrdma-shim --metrics-listen): the
// text exposition format 0.0.4 over HTTP, GET /metrics. Every worker
// renders its samples in its own thread (metrics_samples); the daemon's
// thread joins them into families (metrics_exposition) and answers.
//
//   vrdma_guest_messages_total{guest="a",worker="0"} 20480
//   vrdma_guest_remote_access_errors_total{guest="a"} 0
//   vrdma_worker_busy_seconds_total{worker="0"} 1.204
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <vector>

#include "engine.h"
#include "metric_samples.h"

namespace vrdma::shim {

// Appends worker `worker`'s samples, one "NAME\tLABELS\tVALUE" line each.
void metrics_samples(Engine& eng, uint32_t worker, uint64_t asleep_ns, std::string& out);
// The exposition of the samples of every worker: HELP and TYPE once per
// family (the shim's own, and `more`: the transports'), then its samples,
// and the shim's own (vrdma_up, uptime).
std::string metrics_exposition(const std::string& samples, uint64_t uptime_ns,
                               const std::vector<MetricFamily>& more = {});

// The whole HTTP/1.0 response to the request whose head (request line and
// headers) is `head`: 200 with `body()` for GET (or HEAD) /metrics, 404 for
// another path, 405 for another method, 400 for what is not HTTP.
std::string metrics_http_response(const std::string& head, const std::function<std::string()>& body);

}  // namespace vrdma::shim
