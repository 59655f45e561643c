#include "cdi_spec.h"

#include <dirent.h>
#include <sys/stat.h>
#include <limits.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "vrdma_common/guest_paths.h"

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

int print_cdi_spec(const std::string& run_dir, const std::vector<std::string>& guests, const Provider& provider,
                   const char* tool) {
    char real[PATH_MAX];
    if (!realpath(run_dir.c_str(), real)) {
        fprintf(stderr, "%s: ", tool);
        fprintf(stderr, "cannot resolve %s: %s\n", run_dir.c_str(), strerror(errno));
        return 3;
    }
    const std::string dir(real);
    std::string lib = provider.library;
    lib.resize(lib.size() - std::strlen("-rdmav34.so"));  // RDMAV_DRIVERS takes the path without the suffix
    std::vector<CdiGuest> out;
    for (const std::string& g : guests) {
        const vrdma::GuestPaths p = vrdma::guest_paths(dir, g);
        struct stat st;
        if (stat(p.dir.c_str(), &st) != 0) {
            fprintf(stderr, "%s: no guest '%s' in %s\n", tool, g.c_str(), dir.c_str());
            return 3;
        }
        // The one uverbs entry the shim published for the guest names its node.
        std::string node;
        if (DIR* d = opendir((p.sysfs + "/class/infiniband_verbs").c_str())) {
            while (dirent* e = readdir(d))
                if (std::strncmp(e->d_name, "uverbs_vrdma_", 13) == 0) node = std::string("/dev/infiniband/") + e->d_name;
            closedir(d);
        }
        if (node.empty()) {
            fprintf(stderr, "%s: ", tool);
        fprintf(stderr, "guest '%s' has no uverbs entry in %s/class/infiniband_verbs\n", g.c_str(),
                    p.sysfs.c_str());
            return 3;
        }
        CdiGuest c{g, p.dir, node, {}};
        c.env = {{"SYSFS_PATH", p.sysfs}, {"LD_PRELOAD", provider.library}, {"RDMAV_DRIVERS", lib},
                 {"VRDMA_RUN_DIR", dir}, {"VRDMA_GUEST", g}};
        if (const char* shim = getenv("VRDMA_SHIM_UID"); shim && *shim) c.env.push_back({"VRDMA_SHIM_UID", shim});
        out.push_back(std::move(c));
    }
    fputs(cdi_spec(out, provider.library).c_str(), stdout);
    return 0;
}

std::string cdi_spec(const std::vector<CdiGuest>& guests, const std::string& provider) {
    std::string out = "{\n  \"cdiVersion\": \"0.5.0\",\n  \"kind\": \"vrdma.dev/guest\",\n  \"devices\": [";
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
