#include "provider_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>

namespace vrdma::tools {
namespace {

std::string self_dir() {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return "";
    buf[n] = 0;
    std::string p(buf);
    return p.substr(0, p.rfind('/'));
}

bool exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

}  // namespace

Provider find_provider() {
    if (self_dir() == VRDMA_BUILD_TOOLS_DIR && exists(VRDMA_BUILD_PROVIDER)) return {VRDMA_BUILD_PROVIDER, true};
    if (exists(VRDMA_INSTALLED_PROVIDER)) return {VRDMA_INSTALLED_PROVIDER, false};
    if (exists(VRDMA_BUILD_PROVIDER)) return {VRDMA_BUILD_PROVIDER, true};
    return {};
}

}  // namespace vrdma::tools
