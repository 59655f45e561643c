// vrdma-run: run a program attached to one guest's vrdma device.
//
// It sets the environment that makes an unmodified libibverbs program see
// exactly that guest's device (vrdma0) and execs the program:
//   SYSFS_PATH      the guest's sysfs-shaped tree published by the shim
//   LD_PRELOAD      the provider library (hides the kernel's RDMA netlink so
//                   libibverbs uses SYSFS_PATH; provides completion channels)
//   RDMAV_DRIVERS   the provider, when it is not installed where libibverbs
//                   looks for providers
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "vrdma_common/guest_paths.h"

namespace {

constexpr const char* kUsage =
    "Usage: vrdma-run [--run-dir DIR] --guest NAME [--] PROGRAM [ARGS...]\n"
    "       vrdma-run [--run-dir DIR] --guest-by-rank NAME,NAME... [--] PROGRAM [ARGS...]\n";

constexpr const char* kHelp =
    "NAME\n"
    "    vrdma-run - run a program attached to a guest's vrdma device\n"
    "\n"
    "SYNOPSIS\n"
    "    vrdma-run [--run-dir DIR] --guest NAME [--] PROGRAM [ARGS...]\n"
    "    vrdma-run [--run-dir DIR] --guest-by-rank NAME,NAME... [--] PROGRAM [ARGS...]\n"
    "    vrdma-run --print-env [--run-dir DIR] --guest NAME\n"
    "\n"
    "DESCRIPTION\n"
    "    Runs PROGRAM so that libibverbs lists exactly one RDMA device, vrdma0,\n"
    "    served by the vrdma-shim that publishes guest NAME under DIR. The\n"
    "    program is unmodified: ibv_devinfo, the ibv_*_pingpong examples,\n"
    "    perftest and MPI programs run as they are. vrdma-run checks that the\n"
    "    shim answers, sets the environment below and replaces itself with\n"
    "    PROGRAM (its exit status is PROGRAM's).\n"
    "\n"
    "OPTIONS\n"
    "    --run-dir DIR\n"
    "        The shim's run directory (vrdma-shim --run-dir). Default: the\n"
    "        VRDMA_RUN_DIR environment variable, else /run/vrdma.\n"
    "    --guest NAME\n"
    "        The guest (tenant) whose device the program uses. Default: the\n"
    "        VRDMA_GUEST environment variable.\n"
    "    --guest-by-rank NAME,NAME...\n"
    "        For MPI launchers: choose the guest from the process's MPI rank,\n"
    "        round robin over the list (rank r uses name r mod count). The rank\n"
    "        is read from OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or\n"
    "        SLURM_PROCID, the first one set; none set is an error. Write\n"
    "        a,a,b,b for blocks of two. Overrides --guest.\n"
    "    --print-env\n"
    "        Print the environment as shell assignments instead of running a\n"
    "        program, for use by hand, in container images or with\n"
    "        `mpirun -x`.\n"
    "    -h, --help\n"
    "        Show this text.\n"
    "\n"
    "ENVIRONMENT SET FOR PROGRAM\n"
    "    SYSFS_PATH      DIR/NAME/sys, the guest's device tree\n"
    "    LD_PRELOAD      the vrdma provider library, prepended\n"
    "    RDMAV_DRIVERS   the provider's path, when it runs from a build tree\n"
    "    VRDMA_RUN_DIR, VRDMA_GUEST  the chosen run directory and guest\n"
    "\n"
    "EXIT STATUS\n"
    "    PROGRAM's status; 2 for wrong usage; 3 when the shim does not serve\n"
    "    NAME or is not running; 127 when PROGRAM cannot be executed.\n"
    "\n"
    "EXAMPLE\n"
    "    vrdma-shim --run-dir /run/vrdma --guest a --guest b &\n"
    "    vrdma-run --guest a -- ibv_devinfo -v\n"
    "    vrdma-run --guest a -- ibv_rc_pingpong -g 0 &\n"
    "    vrdma-run --guest b -- ibv_rc_pingpong -g 0 127.0.0.1\n"
    "    mpirun -np 4 vrdma-run --guest-by-rank a,b -- ./mpi_program\n"
    "                 (ranks 0 and 2 in guest a, 1 and 3 in guest b; docs/mpi.md)\n";

int usage_error(const std::string& msg) {
    fprintf(stderr, "vrdma-run: %s\n%s", msg.c_str(), kUsage);
    return 2;
}

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

struct Provider {
    std::string library;  // the .so to preload
    bool from_build_tree = false;
};

// Run from the build tree: use the provider built beside us. Installed: use
// the one installed for libibverbs.
Provider find_provider() {
    if (self_dir() == VRDMA_BUILD_TOOLS_DIR && exists(VRDMA_BUILD_PROVIDER))
        return {VRDMA_BUILD_PROVIDER, true};
    if (exists(VRDMA_INSTALLED_PROVIDER)) return {VRDMA_INSTALLED_PROVIDER, false};
    if (exists(VRDMA_BUILD_PROVIDER)) return {VRDMA_BUILD_PROVIDER, true};
    return {};
}

struct EnvVar {
    std::string name, value;
};

std::vector<EnvVar> guest_environment(const std::string& run_dir, const std::string& guest,
                                      const Provider& provider) {
    std::vector<EnvVar> env;
    env.push_back({"SYSFS_PATH", vrdma::guest_paths(run_dir, guest).sysfs});
    std::string preload = provider.library;
    const char* old = getenv("LD_PRELOAD");
    if (old && *old && std::string(old).find(provider.library) == std::string::npos)
        preload += std::string(":") + old;
    else if (old && *old)
        preload = old;
    env.push_back({"LD_PRELOAD", preload});
    if (provider.from_build_tree) {
        // libibverbs appends "-rdmav34.so" to an absolute driver path.
        std::string lib = provider.library;
        lib.resize(lib.size() - std::strlen("-rdmav34.so"));
        env.push_back({"RDMAV_DRIVERS", lib});
    }
    env.push_back({"VRDMA_RUN_DIR", run_dir});
    env.push_back({"VRDMA_GUEST", guest});
    return env;
}

// The MPI rank of this process as its launcher tells it, or -1.
long launcher_rank(std::string& from) {
    for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
        const char* v = getenv(var);
        if (!v || !*v) continue;
        char* end = nullptr;
        errno = 0;
        long r = strtol(v, &end, 10);
        if (errno || *end || r < 0) continue;
        from = var;
        return r;
    }
    return -1;
}

std::vector<std::string> split_list(const std::string& list) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        size_t comma = list.find(',', start);
        out.push_back(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    const char* env_dir = getenv("VRDMA_RUN_DIR");
    const char* env_guest = getenv("VRDMA_GUEST");
    std::string run_dir = env_dir && *env_dir ? env_dir : VRDMA_DEFAULT_RUN_DIR;
    std::string guest = env_guest ? env_guest : "";
    bool print_env = false;
    std::string by_rank;  // --guest-by-rank list
    int i = 1;
    for (; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--") {
            ++i;
            break;
        }
        if (a == "-h" || a == "--help") {
            fputs(kHelp, stdout);
            return 0;
        }
        if (a == "--print-env") {
            print_env = true;
        } else if (a == "--run-dir" || a == "--guest") {
            if (i + 1 >= argc) return usage_error(a + " needs a value");
            (a == "--run-dir" ? run_dir : guest) = argv[++i];
        } else if (a.rfind("--run-dir=", 0) == 0) {
            run_dir = a.substr(10);
        } else if (a.rfind("--guest=", 0) == 0) {
            guest = a.substr(8);
        } else if (a == "--guest-by-rank") {
            if (i + 1 >= argc) return usage_error(a + " needs a value");
            by_rank = argv[++i];
        } else if (a.rfind("--guest-by-rank=", 0) == 0) {
            by_rank = a.substr(16);
        } else if (a.size() > 1 && a[0] == '-') {
            return usage_error("unknown option " + a);
        } else {
            break;  // the program
        }
    }
    if (!by_rank.empty()) {
        auto names = split_list(by_rank);
        for (auto& n : names)
            if (!vrdma::valid_guest_name(n))
                return usage_error("invalid guest name '" + n + "' in --guest-by-rank " + by_rank);
        std::string from;
        long rank = launcher_rank(from);
        if (rank < 0)
            return usage_error("--guest-by-rank: no MPI rank in the environment (OMPI_COMM_WORLD_RANK, "
                               "PMIX_RANK, PMI_RANK, SLURM_PROCID); run vrdma-run under mpirun");
        guest = names[size_t(rank) % names.size()];
    }
    if (guest.empty()) return usage_error("no guest given (--guest NAME)");
    if (!vrdma::valid_guest_name(guest))
        return usage_error("invalid guest name '" + guest + "' (1-32 of A-Z a-z 0-9 _ . -)");
    if (!print_env && i >= argc) return usage_error("no program given");
    if (run_dir.empty() || run_dir[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof(cwd))) return usage_error("cannot resolve --run-dir");
        run_dir = std::string(cwd) + "/" + run_dir;
    }

    std::string problem = vrdma::probe_guest(run_dir, guest);
    if (!problem.empty()) {
        fprintf(stderr, "vrdma-run: %s\n", problem.c_str());
        return 3;
    }
    Provider provider = find_provider();
    if (provider.library.empty()) {
        fprintf(stderr, "vrdma-run: the vrdma provider library is neither built (%s) nor installed (%s)\n",
                VRDMA_BUILD_PROVIDER, VRDMA_INSTALLED_PROVIDER);
        return 3;
    }

    auto env = guest_environment(run_dir, guest, provider);
    if (print_env) {
        for (auto& e : env) printf("export %s='%s'\n", e.name.c_str(), e.value.c_str());
        return 0;
    }
    for (auto& e : env) setenv(e.name.c_str(), e.value.c_str(), 1);
    execvp(argv[i], argv + i);
    fprintf(stderr, "vrdma-run: cannot run %s: %s\n", argv[i], strerror(errno));
    return 127;
}
