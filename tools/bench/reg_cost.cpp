// vrdma-reg-cost: what ibv_reg_mr plus ibv_dereg_mr costs on vrdma0 for
// each kind of memory and size, beside a memcpy of the same size measured
// in the same run (docs/performance.md "Memory registration"). Each
// registration is of fresh memory (touched, so its pages exist), the case
// where private pages must move; "again" registers the same range a second
// time (the pages are already shared with the shim).
//
//   vrdma-run --guest a -- vrdma-reg-cost
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void* fresh(bool shared_file, size_t len) {
    void* p;
    if (shared_file) {
        std::string name = "/vrdma-reg-cost-" + std::to_string(getpid());
        int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 || ftruncate(fd, off_t(len)) != 0) return nullptr;
        shm_unlink(name.c_str());
        p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    } else {
        p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (p == MAP_FAILED) return nullptr;
    std::memset(p, 1, len);
    return p;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1) {
        std::puts("usage: vrdma-reg-cost   (under vrdma-run: times ibv_reg_mr + ibv_dereg_mr on vrdma0)");
        return std::strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list || n == 0) return std::fprintf(stderr, "vrdma-reg-cost: no RDMA device\n"), 1;
    ibv_context* ctx = ibv_open_device(list[0]);
    ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
    if (!pd) return std::fprintf(stderr, "vrdma-reg-cost: cannot open %s\n", ibv_get_device_name(list[0])), 1;
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    std::printf("%-12s %8s %14s %14s %12s %8s\n", "memory", "size", "reg+dereg us", "again us", "memcpy us",
                "ratio");
    for (size_t len : {size_t(4096), size_t(1) << 20, size_t(64) << 20}) {
        const int iters = len <= 4096 ? 200 : len <= (1 << 20) ? 40 : 4;
        std::vector<char> a(len, 1), b(len);
        double t0 = now_us();
        for (int i = 0; i < iters; ++i) {
            std::memcpy(b.data(), a.data(), len);
            asm volatile("" ::"r"(b.data()) : "memory");
        }
        const double copy = (now_us() - t0) / iters;
        for (bool shared : {false, true}) {
            double first = 0, again = 0;
            for (int i = 0; i < iters; ++i) {
                void* p = fresh(shared, len);
                if (!p) return std::perror("vrdma-reg-cost: memory"), 1;
                double s = now_us();
                ibv_mr* mr = ibv_reg_mr(pd, p, len, access);
                if (!mr || ibv_dereg_mr(mr) != 0) return std::perror("vrdma-reg-cost: ibv_reg_mr"), 1;
                double m = now_us();
                mr = ibv_reg_mr(pd, p, len, access);
                if (!mr || ibv_dereg_mr(mr) != 0) return std::perror("vrdma-reg-cost: ibv_reg_mr"), 1;
                double e = now_us();
                first += m - s;
                again += e - m;
                munmap(p, len);
            }
            first /= iters;
            again /= iters;
            std::printf("%-12s %8zu %14.1f %14.1f %12.1f %8.1f\n", shared ? "shared-file" : "anonymous", len, first,
                        again, copy, first / copy);
        }
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
