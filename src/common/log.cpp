#include "vrdma_common/log.h"

#include <atomic>
#include <cstdio>

namespace vrdma {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
const char* g_prefix = "vrdma";
const char* const kNames[] = {"error", "warning", "info", "debug"};
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void set_log_prefix(const char* prefix) { g_prefix = prefix; }

void log_msg(LogLevel level, const char* fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    // One write per line so that lines from several threads do not interleave.
    fprintf(stderr, "%s: %s: %s\n", g_prefix, kNames[static_cast<int>(level)], line);
}

}  // namespace vrdma
