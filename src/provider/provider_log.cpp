// The provider's messages go through the project's leveled log (the same
// format as the shim's), with the prefix "libvrdma". VRDMA_LOG_LEVEL,
// read once when the provider is loaded, chooses what is printed: error,
// warning (the default: every message explains a verb that failed), info,
// debug, or none.
#include <cstdlib>
#include <cstring>

#include "vrdma_common/log.h"

namespace vrdma::prov {
namespace {

struct ProviderLog {
    ProviderLog() {
        set_log_prefix("libvrdma");
        set_log_level(LogLevel::Warn);
        const char* s = std::getenv("VRDMA_LOG_LEVEL");
        if (!s) return;
        if (!std::strcmp(s, "none"))
            set_log_level(static_cast<LogLevel>(-1));  // below Error: nothing passes
        else if (!std::strcmp(s, "error"))
            set_log_level(LogLevel::Error);
        else if (!std::strcmp(s, "info"))
            set_log_level(LogLevel::Info);
        else if (!std::strcmp(s, "debug"))
            set_log_level(LogLevel::Debug);
        // "warning" and anything unknown: the default
    }
};
const ProviderLog g_provider_log;

}  // namespace
}  // namespace vrdma::prov
