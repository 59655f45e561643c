#include "metric_samples.h"

#include <cstdio>

namespace vrdma::shim {

void add_sample(std::string& out, const char* name, const std::string& labels, double value) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", value);
    out += name;
    out += '\t';
    out += labels;
    out += '\t';
    out += buf;
    out += '\n';
}

void add_sample(std::string& out, const char* name, const std::string& labels, uint64_t value) {
    out += std::string(name) + '\t' + labels + '\t' + std::to_string(value) + '\n';
}

// Guest names are [A-Za-z0-9_.-], so nothing needs escaping, but nothing
// else is trusted either.
std::string label_value(const std::string& v) {
    std::string out;
    for (char c : v) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

}  // namespace vrdma::shim
