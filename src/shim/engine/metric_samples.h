// Samples for the shim's Prometheus exposition (daemon/metrics.h), as
// every worker renders them in its own thread: one "NAME\tLABELS\tVALUE"
// line each. The engine's parts and each transport append theirs; the
// daemon joins them into families, each with the type and help its
// MetricFamily gives.
#pragma once

#include <cstdint>
#include <string>

namespace vrdma::shim {

struct MetricFamily {
    const char* name;
    const char* type;  // "gauge" or "counter"
    const char* help;
};

void add_sample(std::string& out, const char* name, const std::string& labels, double value);
void add_sample(std::string& out, const char* name, const std::string& labels, uint64_t value);
// A label value, escaped as the text format wants it.
std::string label_value(const std::string& v);
// Nanoseconds as seconds.
inline double seconds(uint64_t ns) { return double(ns) / 1e9; }

}  // namespace vrdma::shim
