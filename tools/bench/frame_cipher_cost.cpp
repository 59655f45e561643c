// vrdma-frame-cipher-cost: what sealing and opening one fabric frame
// costs with each of the two AES-GCM implementations the shim has
// (src/shim/transport/fabric/frame_cipher.h), by data size and
// --fabric-crypto mode, beside a memcpy of the same size measured in the
// same run. The size where nettle stops being the cheaper is where
// kSmallFrameBytes belongs (docs/performance.md).
//
//   vrdma-frame-cipher-cost [--iters N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "frame_channel.h"

using namespace vrdma::shim::fabric;

namespace {

constexpr size_t kHeader = 4;

double now_ns() {
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best of five runs of `iters` calls of f, in ns a call.
template <typename F>
double best_ns(int iters, F&& f) {
    double best = 1e30;
    for (int run = 0; run < 5; ++run) {
        const double t0 = now_ns();
        for (int i = 0; i < iters; ++i) f(i);
        best = std::min(best, (now_ns() - t0) / iters);
    }
    return best;
}

struct Costs {
    double seal, open;
};

Costs measure(FrameCipher::Impl impl, CryptoMode mode, size_t n, int iters) {
    const uint8_t key[kFrameKeyBytes] = {7, 6, 5, 4, 3, 2, 1};
    uint8_t iv[kFrameIvBytes] = {1, 2, 3};
    FrameCipher sealer(true), opener(false);
    sealer.force(impl);
    opener.force(impl);
    if (!sealer.ok() || !opener.ok() || !sealer.set_key(key) || !opener.set_key(key)) {
        std::fprintf(stderr, "vrdma-frame-cipher-cost: cannot set up AES-GCM\n");
        std::exit(1);
    }
    std::vector<uint8_t> data(n, 0x5a), frame(kHeader + n + kFrameTagBytes), sealed;
    const uint32_t len = uint32_t(n);
    std::memcpy(frame.data(), &len, kHeader);
    Costs c{};
    c.seal = best_ns(iters, [&](int i) {
        iv[11] = uint8_t(i);
        sealer.seal(mode, iv, frame.data(), kHeader, data.data(), n);
    });
    // Opening decrypts in place: each call opens a fresh copy of one frame
    // (the copy's cost is taken off with a memcpy of the same frame).
    iv[11] = 0;
    sealer.seal(mode, iv, frame.data(), kHeader, data.data(), n);
    sealed = frame;
    const double copy = best_ns(iters, [&](int) { std::memcpy(frame.data(), sealed.data(), sealed.size()); });
    bool all_ok = true;
    const double open_and_copy = best_ns(iters, [&](int) {
        std::memcpy(frame.data(), sealed.data(), sealed.size());
        all_ok &= opener.open(mode, iv, frame.data(), kHeader, n);
    });
    if (!all_ok) {
        std::fprintf(stderr, "vrdma-frame-cipher-cost: a frame failed to open\n");
        std::exit(1);
    }
    c.open = std::max(0.0, open_and_copy - copy);
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    int iters = 20000;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--iters" && i + 1 < argc) {
            iters = std::max(1, std::atoi(argv[++i]));
        } else if (a == "--help" || a == "-h") {
            std::printf(
                "usage: vrdma-frame-cipher-cost [--iters N]\n\n"
                "Sealing and opening one fabric frame with nettle's and with OpenSSL's AES-GCM, in ns,\n"
                "by data size and --fabric-crypto mode, beside a memcpy of the data (best of 5 runs\n"
                "of N frames, default 20000). 'shim uses' is the implementation the shim picks for\n"
                "that size on this CPU (nettle up to %zu bytes where the CPU has AES-NI and PCLMULQDQ).\n",
                kSmallFrameBytes);
            return 0;
        } else {
            std::fprintf(stderr, "vrdma-frame-cipher-cost: unknown argument '%s' (try --help)\n", a.c_str());
            return 2;
        }
    }
    std::printf("| mode | data bytes | memcpy ns | seal ns: nettle | OpenSSL | open ns: nettle | OpenSSL | shim uses |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    FrameCipher probe(true);
    for (CryptoMode mode : {CryptoMode::Encrypt, CryptoMode::Integrity}) {
        for (size_t n : {16, 64, 144, 256, 512, 768, 1024, 2048, 4096, 16384, 65536}) {
            const int it = n > 4096 ? std::max(1, iters / 16) : iters;
            std::vector<uint8_t> a(n, 1), b(n);
            const double copy = best_ns(it, [&](int) {
                std::memcpy(b.data(), a.data(), n);
                asm volatile("" ::"r"(b.data()) : "memory");
            });
            const Costs nettle = measure(FrameCipher::Impl::Nettle, mode, n, it);
            const Costs openssl = measure(FrameCipher::Impl::OpenSsl, mode, n, it);
            std::printf("| %s | %zu | %.0f | %.0f | %.0f | %.0f | %.0f | %s |\n", crypto_mode_name(mode), n, copy,
                        nettle.seal, openssl.seal, nettle.open, openssl.open,
                        probe.uses_nettle(n) ? "nettle" : "OpenSSL");
        }
    }
    std::printf("\nnettle usable on this CPU (AES-NI and PCLMULQDQ): %s\n", FrameCipher::nettle_usable() ? "yes" : "no");
    return 0;
}
