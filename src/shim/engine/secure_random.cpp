#include "secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace vrdma::shim {

namespace {
thread_local bool t_predictable = false;
thread_local uint64_t t_state = 0;
}  // namespace

void secure_random_make_predictable(uint64_t seed) {
    t_predictable = true;
    t_state = seed;
}

uint32_t secure_random_u32() {
    if (t_predictable) {  // splitmix64
        uint64_t z = (t_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return uint32_t((z ^ (z >> 31)) >> 32);
    }
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
