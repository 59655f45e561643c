#include "secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace vrdma::shim {

uint32_t secure_random_u32() {
    thread_local uint32_t pool[512];
    thread_local size_t left = 0;
    if (left == 0) {
        size_t got = 0;
        auto* p = reinterpret_cast<unsigned char*>(pool);
        while (got < sizeof(pool)) {
            ssize_t n = getrandom(p + got, sizeof(pool) - got, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                std::fprintf(stderr, "vrdma-shim: getrandom failed: no random numbers for keys and QPNs\n");
                std::abort();
            }
            got += size_t(n);
        }
        left = sizeof(pool) / sizeof(pool[0]);
    }
    return pool[--left];
}

}  // namespace vrdma::shim
