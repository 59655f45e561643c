// Minimal leveled logging to stderr, with a component prefix.
#pragma once

#include <cstdarg>

namespace vrdma {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void set_log_prefix(const char* prefix);  // e.g. "vrdma-shim"

[[gnu::format(printf, 2, 3)]] void log_msg(LogLevel level, const char* fmt, ...);

}  // namespace vrdma

#define VRDMA_LOG(level, ...)                                                \
    do {                                                                     \
        if (static_cast<int>(level) <= static_cast<int>(::vrdma::log_level())) \
            ::vrdma::log_msg(level, __VA_ARGS__);                            \
    } while (0)
#define LOG_ERR(...) VRDMA_LOG(::vrdma::LogLevel::Error, __VA_ARGS__)
#define LOG_WARN(...) VRDMA_LOG(::vrdma::LogLevel::Warn, __VA_ARGS__)
#define LOG_INFO(...) VRDMA_LOG(::vrdma::LogLevel::Info, __VA_ARGS__)
#define LOG_DEBUG(...) VRDMA_LOG(::vrdma::LogLevel::Debug, __VA_ARGS__)
