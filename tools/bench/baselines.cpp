// vrdma-baselines: the floors that vrdma's numbers are compared with, measured
// on the same machine in the same run as the benchmarks (scripts/bench.sh).
//
//   memcpy SIZE          single-thread memcpy bandwidth, MiB/s
//   shm-pingpong         two processes bouncing 8 bytes through shared memory,
//                        one-way latency in microseconds
//   shm-relay            sender -> relay -> receiver and back, three processes
//                        (the shape of guest -> shim -> guest), one-way us
//   tcp-pingpong         8 bytes over TCP loopback (TCP_NODELAY), one-way us
//   tcp-pingpong --listen ADDR:PORT | --connect ADDR:PORT
//                        the same between two processes started apart (two
//                        network namespaces: scripts/bench-fabric.sh): the
//                        listener answers one connection, the connecting side
//                        measures and prints
//   tcp-pingpong-spin ...  the same, each reader polling its socket
//                        (non-blocking reads, spin then yield) instead of
//                        sleeping in read(): the floor for a TCP transport
//                        that waits the way vrdma's shims do
//
// Waiting processes spin briefly and then yield the CPU, as vrdma's pollers
// do, so that three processes on two cores are measured the same way.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Spin, then yield: the same idle policy as vrdma's poll_cq and shim.
void wait_for(const std::atomic<uint64_t>& word, uint64_t value) {
    unsigned spins = 0;
    while (word.load(std::memory_order_acquire) != value) {
        if (++spins > 64) sched_yield();
    }
}

int bench_memcpy(size_t size) {
    // Page-aligned like perftest's buffers. (Heap buffers 16 bytes apart mod
    // 4096 run ten times slower here: loads falsely alias earlier stores.)
    const size_t bytes = (size + 4095) / 4096 * 4096;
    auto* src = static_cast<char*>(std::aligned_alloc(4096, bytes));
    auto* dst = static_cast<char*>(std::aligned_alloc(4096, bytes));
    std::memset(src, 1, bytes);
    std::memset(dst, 0, bytes);
    size_t iters = 0;
    auto t0 = Clock::now();
    double elapsed = 0;
    do {
        for (int i = 0; i < 1000; ++i) {
            std::memcpy(dst, src, size);
            asm volatile("" ::"r"(dst) : "memory");
        }
        iters += 1000;
        elapsed = seconds_since(t0);
    } while (elapsed < 1.0);
    printf("memcpy %zu %.1f MiB/s\n", size, double(size) * iters / elapsed / (1 << 20));
    std::free(src);
    std::free(dst);
    return 0;
}

struct Slots {
    alignas(64) std::atomic<uint64_t> s[4];
    alignas(64) char pad[64];
};

Slots* shared_slots() {
    void* p = mmap(nullptr, sizeof(Slots), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return new (p) Slots{};
}

constexpr int kIters = 20000;

void report_latency(const char* name, double total_s, int iters) {
    printf("%s 8 %.2f us\n", name, total_s / iters / 2 * 1e6);
}

int bench_shm_pingpong() {
    Slots* sl = shared_slots();
    pid_t child = fork();
    if (child == 0) {
        for (uint64_t i = 1; i <= kIters; ++i) {
            wait_for(sl->s[0], i);
            sl->s[1].store(i, std::memory_order_release);
        }
        _exit(0);
    }
    auto t0 = Clock::now();
    for (uint64_t i = 1; i <= kIters; ++i) {
        sl->s[0].store(i, std::memory_order_release);
        wait_for(sl->s[1], i);
    }
    report_latency("shm-pingpong", seconds_since(t0), kIters);
    waitpid(child, nullptr, 0);
    return 0;
}

// Relay: s[0] sender->relay, s[1] relay->receiver, s[2] receiver->relay,
// s[3] relay->sender. The relay serves both directions like the shim does.
int bench_shm_relay() {
    Slots* sl = shared_slots();
    pid_t relay = fork();
    if (relay == 0) {
        uint64_t fwd = 0, back = 0;
        unsigned idle = 0;
        while (back < kIters) {
            bool worked = false;
            uint64_t f = sl->s[0].load(std::memory_order_acquire);
            if (f != fwd) {
                fwd = f;
                sl->s[1].store(f, std::memory_order_release);
                worked = true;
            }
            uint64_t b = sl->s[2].load(std::memory_order_acquire);
            if (b != back) {
                back = b;
                sl->s[3].store(b, std::memory_order_release);
                worked = true;
            }
            if (worked)
                idle = 0;
            else if (++idle > 64)
                sched_yield();
        }
        _exit(0);
    }
    pid_t receiver = fork();
    if (receiver == 0) {
        for (uint64_t i = 1; i <= kIters; ++i) {
            wait_for(sl->s[1], i);
            sl->s[2].store(i, std::memory_order_release);
        }
        _exit(0);
    }
    auto t0 = Clock::now();
    for (uint64_t i = 1; i <= kIters; ++i) {
        sl->s[0].store(i, std::memory_order_release);
        wait_for(sl->s[3], i);
    }
    report_latency("shm-relay", seconds_since(t0), kIters);
    waitpid(relay, nullptr, 0);
    waitpid(receiver, nullptr, 0);
    return 0;
}

bool parse_addr(const std::string& s, sockaddr_in& a) {
    auto colon = s.rfind(':');
    if (colon == std::string::npos) return false;
    a = {};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(strtoul(s.c_str() + colon + 1, nullptr, 10)));
    return inet_pton(AF_INET, s.substr(0, colon).c_str(), &a.sin_addr) == 1 && a.sin_port != 0;
}

// Whether tcp-pingpong-spin was asked for: the reader polls the socket
// (non-blocking reads, spin then yield, as vrdma's pollers and shims wait)
// instead of sleeping in read() until the kernel wakes it.
bool g_tcp_spin = false;

// 8 bytes back and forth kIters times; FIRST writes first.
bool tcp_exchange(int fd, bool first) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[8] = {};
    for (int i = 0; i < kIters; ++i) {
        if (first && write(fd, buf, 8) != 8) return false;
        size_t got = 0;
        unsigned spins = 0;
        while (got < 8) {
            ssize_t n = recv(fd, buf + got, 8 - got, g_tcp_spin ? MSG_DONTWAIT : 0);
            if (n < 0 && g_tcp_spin && errno == EAGAIN) {
                if (++spins > 64) sched_yield();
                continue;
            }
            if (n <= 0) return false;
            got += size_t(n);
        }
        if (!first && write(fd, buf, 8) != 8) return false;
    }
    return true;
}

int tcp_listen(const sockaddr_in& at, sockaddr_in& bound) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    bound = at;
    socklen_t alen = sizeof(bound);
    if (bind(ls, reinterpret_cast<const sockaddr*>(&at), sizeof(at)) || listen(ls, 1) ||
        getsockname(ls, reinterpret_cast<sockaddr*>(&bound), &alen)) {
        perror("tcp listen");
        return -1;
    }
    return ls;
}

// The connecting side measures. Retries the connection for 10 s while the
// listener starts.
int tcp_connect_and_measure(const sockaddr_in& to) {
    int fd = -1;
    for (int tries = 0; tries < 200; ++tries) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0) break;
        close(fd);
        fd = -1;
        usleep(50000);
    }
    if (fd < 0) {
        perror("tcp connect");
        return 1;
    }
    auto t0 = Clock::now();
    bool ok = tcp_exchange(fd, true);
    if (ok) report_latency(g_tcp_spin ? "tcp-pingpong-spin" : "tcp-pingpong", seconds_since(t0), kIters);
    close(fd);
    return ok ? 0 : 1;
}

int bench_tcp_pingpong(const std::string& mode, const std::string& addr) {
    sockaddr_in a{};
    if (!mode.empty() && !parse_addr(addr, a)) {
        fprintf(stderr, "tcp-pingpong: %s needs IPV4:PORT, not '%s'\n", mode.c_str(), addr.c_str());
        return 2;
    }
    if (mode == "--connect") return tcp_connect_and_measure(a);
    if (mode == "--listen") {
        sockaddr_in bound{};
        int ls = tcp_listen(a, bound);
        if (ls < 0) return 1;
        int fd = accept(ls, nullptr, nullptr);
        close(ls);
        return fd >= 0 && tcp_exchange(fd, false) ? 0 : 1;
    }
    // Both ends here, over loopback.
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sockaddr_in bound{};
    int ls = tcp_listen(a, bound);
    if (ls < 0) return 1;
    pid_t child = fork();
    if (child == 0) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, reinterpret_cast<sockaddr*>(&bound), sizeof(bound))) _exit(1);
        _exit(tcp_exchange(fd, false) ? 0 : 1);
    }
    int fd = accept(ls, nullptr, nullptr);
    auto t0 = Clock::now();
    bool ok = tcp_exchange(fd, true);
    report_latency(g_tcp_spin ? "tcp-pingpong-spin" : "tcp-pingpong", seconds_since(t0), kIters);
    waitpid(child, nullptr, 0);
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    std::string what = argc > 1 ? argv[1] : "";
    if (what == "memcpy") return bench_memcpy(argc > 2 ? strtoul(argv[2], nullptr, 0) : 65536);
    if (what == "shm-pingpong") return bench_shm_pingpong();
    if (what == "shm-relay") return bench_shm_relay();
    if (what == "tcp-pingpong" || what == "tcp-pingpong-spin") {
        g_tcp_spin = what == "tcp-pingpong-spin";
        return bench_tcp_pingpong(argc > 2 ? argv[2] : "", argc > 3 ? argv[3] : "");
    }
    fprintf(stderr,
            "usage: vrdma-baselines memcpy [SIZE] | shm-pingpong | shm-relay |\n"
            "                       tcp-pingpong[-spin] [--listen IPV4:PORT | --connect IPV4:PORT]\n"
            "Prints one line: NAME SIZE VALUE UNIT. Used by scripts/bench.sh and\n"
            "scripts/bench-fabric.sh.\n");
    return 2;
}
