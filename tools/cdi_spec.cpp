#include "cdi_spec.h"

#include <cstdio>

namespace vrdma::tools {
namespace {

std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    return out + "\"";
}

std::string ro_bind(const std::string& path) {
    return "{\"hostPath\": " + quoted(path) + ", \"containerPath\": " + quoted(path) +
           ", \"options\": [\"bind\", \"ro\"]}";
}

}  // namespace

std::string cdi_spec(const std::vector<CdiGuest>& guests, const std::string& provider) {
    std::string out = "{\n  \"cdiVersion\": \"0.6.0\",\n  \"kind\": \"vrdma.dev/guest\",\n  \"devices\": [";
    for (size_t i = 0; i < guests.size(); ++i) {
        const CdiGuest& g = guests[i];
        out += i ? ",\n" : "\n";
        out += "    {\n      \"name\": " + quoted(g.name) + ",\n      \"containerEdits\": {\n        \"env\": [";
        for (size_t k = 0; k < g.env.size(); ++k)
            out += (k ? ", " : "") + quoted(g.env[k].first + "=" + g.env[k].second);
        out += "],\n        \"deviceNodes\": [{\"path\": " + quoted(g.uverbs_node) +
               ", \"type\": \"c\", \"major\": 1, \"minor\": 3, \"permissions\": \"rw\"}],\n";
        out += "        \"mounts\": [" + ro_bind(g.dir) + ", " + ro_bind(provider) + "]\n      }\n    }";
    }
    return out + "\n  ]\n}\n";
}

}  // namespace vrdma::tools
