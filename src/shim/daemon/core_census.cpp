#include "core_census.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstring>

namespace vrdma::shim {

CoreCensus::CoreCensus(const char* loadavg) : loadavg_(::open(loadavg, O_RDONLY | O_CLOEXEC)) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus_ = unsigned(CPU_COUNT(&set));
}

// "0.30 1.52 1.90 1/109 29668": the number before the slash.
unsigned CoreCensus::parse_running(const char* text, size_t len) {
    const char* slash = static_cast<const char*>(std::memchr(text, '/', len));
    if (!slash) return 0;
    const char* first = slash;
    while (first > text && first[-1] >= '0' && first[-1] <= '9') --first;
    if (first == slash || slash - first > 9) return 0;  // no count, or not one
    unsigned running = 0;
    for (const char* p = first; p < slash; ++p) running = running * 10 + unsigned(*p - '0');
    return running;
}

bool CoreCensus::cores_to_spare(uint64_t now_ns) {
    if (now_ns < next_sample_ns_) return spare_;
    spare_ = false;
    next_sample_ns_ = now_ns + kSampleNs;
    if (!loadavg_ || !cpus_) return false;
    char buf[128];
    const ssize_t n = ::pread(loadavg_.get(), buf, sizeof(buf), 0);
    if (n <= 0) return false;
    spare_ = spare(parse_running(buf, size_t(n)), cpus_);
    if (spare_) next_sample_ns_ = now_ns + kSpareSampleNs;  // a wrong "spare" costs the guests: look sooner
    return spare_;
}

}  // namespace vrdma::shim
