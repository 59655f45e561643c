// vrdma-run: run a program attached to one guest's vrdma device, or to the
// devices of several guests.
//
// It sets the environment that makes an unmodified libibverbs program see
// exactly that guest's device (vrdma0) and execs the program:
//   SYSFS_PATH      the guest's sysfs-shaped tree published by the shim
//   LD_PRELOAD      the provider library (hides the kernel's RDMA netlink so
//                   libibverbs uses SYSFS_PATH; provides completion channels)
//   RDMAV_DRIVERS   the provider, when it is not installed where libibverbs
//                   looks for providers
//
// With several guests, SYSFS_PATH is a merged tree built in a private
// temporary directory: one uverbs entry per guest (its ibdev renamed vrdma0,
// vrdma1, ...) and class/infiniband/vrdmaN a symbolic link to the guest's own
// published device directory (so the port state the shim rewrites stays
// live, and the provider reads each device's own vrdma_socket). vrdma-run
// still execs the program (same pid, same exit status, same signals); a
// detached janitor process waits for that pid to end and removes the tree,
// and trees whose process is gone are also swept at the next start.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cdi_spec.h"
#include "vrdma_common/fs_at.h"
#include "vrdma_common/guest_paths.h"

namespace {

constexpr const char* kUsage =
    "Usage: vrdma-run [--run-dir DIR] [--shim-user USER] --guest NAME [--guest NAME...] [--] PROGRAM [ARGS...]\n"
    "       vrdma-run [--run-dir DIR] --guest-by-rank NAME,NAME... [--] PROGRAM [ARGS...]\n";

constexpr const char* kHelp =
    "NAME\n"
    "    vrdma-run - run a program attached to a guest's vrdma device\n"
    "\n"
    "SYNOPSIS\n"
    "    vrdma-run [--run-dir DIR] --guest NAME [--] PROGRAM [ARGS...]\n"
    "    vrdma-run [--run-dir DIR] --guest NAME --guest NAME... [--] PROGRAM [ARGS...]\n"
    "    vrdma-run [--run-dir DIR] --guest-by-rank NAME,NAME... [--] PROGRAM [ARGS...]\n"
    "    vrdma-run --print-env [--run-dir DIR] --guest NAME\n"
    "    vrdma-run --cdi [--run-dir DIR] --guest NAME [--guest NAME...]\n"
    "\n"
    "DESCRIPTION\n"
    "    Runs PROGRAM so that libibverbs lists exactly one RDMA device, vrdma0,\n"
    "    served by the vrdma-shim that publishes guest NAME under DIR. The\n"
    "    program is unmodified: ibv_devinfo, the ibv_*_pingpong examples,\n"
    "    perftest and MPI programs run as they are. vrdma-run checks that the\n"
    "    shim answers, sets the environment below and replaces itself with\n"
    "    PROGRAM (its exit status is PROGRAM's).\n"
    "\n"
    "    Given several guests, the program sees one device per guest, in the\n"
    "    order given: the first guest's as vrdma0, the second's as vrdma1, and\n"
    "    so on, each with its own GUID and LID and each served by the shim of\n"
    "    its own guest (the shims may differ: DIR may hold symbolic links to\n"
    "    the guest directories of several run directories). One process can\n"
    "    then connect QPs between guests, for example across two hosts. The\n"
    "    merged device tree lives in a private directory under $TMPDIR (else\n"
    "    /tmp) that is removed when PROGRAM exits.\n"
    "\n"
    "OPTIONS\n"
    "    --run-dir DIR\n"
    "        The shim's run directory (vrdma-shim --run-dir). Default: the\n"
    "        VRDMA_RUN_DIR environment variable, else /run/vrdma.\n"
    "    --guest NAME\n"
    "        The guest (tenant) whose device the program uses. Default: the\n"
    "        VRDMA_GUEST environment variable. Repeat it, or give a comma\n"
    "        list (--guest a,b), to attach the program to several guests'\n"
    "        devices (vrdma0, vrdma1, ... in that order); a guest may appear\n"
    "        only once.\n"
    "    --guest-by-rank NAME,NAME...\n"
    "        For MPI launchers: choose the guest from the process's MPI rank,\n"
    "        round robin over the list (rank r uses name r mod count). The rank\n"
    "        is read from OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or\n"
    "        SLURM_PROCID, the first one set; none set is an error. Write\n"
    "        a,a,b,b for blocks of two. Overrides --guest.\n"
    "    --cdi\n"
    "        Print a Container Device Interface spec (JSON, CDI 0.5.0) with\n"
    "        one device per guest given, kind vrdma.dev/guest, named as the\n"
    "        guest, instead of running a program: saved in /etc/cdi (for\n"
    "        example /etc/cdi/vrdma.json), it lets podman, containerd or\n"
    "        CRI-O hand a container a guest's vrdma0 with\n"
    "        --device vrdma.dev/guest=NAME. Each device sets the environment\n"
    "        above (with RDMAV_DRIVERS, as the image has no vrdma.driver),\n"
    "        mounts the guest's directory and the provider library read-only\n"
    "        at the same paths, and makes the uverbs node libibverbs opens.\n"
    "        The image needs rdma-core's libibverbs with provider ABI 34\n"
    "        (Debian 12's libibverbs1). Make the spec again after the guest\n"
    "        was added anew (its node's name depends on the run directory).\n"
    "    --shim-user USER\n"
    "        Also accept a shim run by USER (a name or uid). Before it hands a\n"
    "        shim anything, vrdma-run (and the provider in PROGRAM) checks that\n"
    "        the guest's directory and the run directory belong to the shim's\n"
    "        user, that nobody else can change them or their ancestors (sticky\n"
    "        ones such as /tmp excepted), and that the process on the socket\n"
    "        runs as that user. The shim's user must be root or this user,\n"
    "        unless named here; sets VRDMA_SHIM_UID for PROGRAM.\n"
    "    --print-env\n"
    "        Print the environment as shell assignments instead of running a\n"
    "        program, for use by hand, in container images or with\n"
    "        `mpirun -x`. One guest only (a multi-guest tree lives only as\n"
    "        long as the program).\n"
    "    -h, --help\n"
    "        Show this text.\n"
    "\n"
    "ENVIRONMENT SET FOR PROGRAM\n"
    "    SYSFS_PATH      DIR/NAME/sys, the guest's device tree (several guests:\n"
    "                    the merged tree described above)\n"
    "    LD_PRELOAD      the vrdma provider library, prepended\n"
    "    RDMAV_DRIVERS   the provider's path, when it runs from a build tree\n"
    "    VRDMA_RUN_DIR, VRDMA_GUEST  the chosen run directory and guest (several\n"
    "                    guests: NAME,NAME,...)\n"
    "    VRDMA_SHIM_UID  the shim user accepted besides root and the caller\n"
    "                    (--shim-user; inherited when already set)\n"
    "\n"
    "ENVIRONMENT READ BY THE PROVIDER (set it for PROGRAM to change it)\n"
    "    VRDMA_POLL_SPIN      empty polls of a CQ before ibv_poll_cq yields the\n"
    "                         CPU (default 64; 0: yield at once)\n"
    "    VRDMA_EVENT_SPIN_US  how long ibv_get_cq_event looks for an event before\n"
    "                         it sleeps (default 20 microseconds; 0: sleep at\n"
    "                         once)\n"
    "\n"
    "EXIT STATUS\n"
    "    PROGRAM's status; 2 for wrong usage; 3 when the shim does not serve\n"
    "    NAME or is not running; 4 when this user may not use guest NAME (the\n"
    "    shim gives each guest an owner: vrdma-shim --guest NAME:owner=USER);\n"
    "    5 when the socket is not a trusted shim's (its directory belongs to,\n"
    "    or can be changed by, another user, or another user listens on it:\n"
    "    nothing was handed over); 127 when PROGRAM cannot be executed.\n"
    "\n"
    "EXAMPLE\n"
    "    vrdma-shim --run-dir /run/vrdma --guest a --guest b &\n"
    "    vrdma-run --guest a -- ibv_devinfo -v\n"
    "    vrdma-run --guest a -- ibv_rc_pingpong -g 0 &\n"
    "    vrdma-run --guest b -- ibv_rc_pingpong -g 0 127.0.0.1\n"
    "    vrdma-run --guest a --guest b -- ibv_devices     (vrdma0 and vrdma1)\n"
    "    mpirun -np 4 vrdma-run --guest-by-rank a,b -- ./mpi_program\n"
    "                 (ranks 0 and 2 in guest a, 1 and 3 in guest b; docs/mpi.md)\n";

int usage_error(const std::string& msg) {
    fprintf(stderr, "vrdma-run: %s\n%s", msg.c_str(), kUsage);
    return 2;
}

bool exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

using vrdma::tools::Provider;
using vrdma::tools::find_provider;

struct EnvVar {
    std::string name, value;
};

// `sysfs` is the SYSFS_PATH to give; `guest` the guest name (or the comma
// list of several).
std::vector<EnvVar> guest_environment(const std::string& run_dir, const std::string& guest,
                                      const std::string& sysfs, const Provider& provider) {
    std::vector<EnvVar> env;
    env.push_back({"SYSFS_PATH", sysfs});
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
    if (const char* shim = getenv("VRDMA_SHIM_UID"); shim && *shim) env.push_back({"VRDMA_SHIM_UID", shim});
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

// A user name or number.
bool parse_user(const std::string& v, uid_t& out) {
    if (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos) {
        errno = 0;
        unsigned long n = strtoul(v.c_str(), nullptr, 10);
        if (errno || n >= 0xffffffffUL) return false;
        out = uid_t(n);
        return true;
    }
    passwd* p = getpwnam(v.c_str());
    if (!p) return false;
    out = p->pw_uid;
    return true;
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

std::string join(const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
    return out;
}

// ---------------------------------------------------------------------------
// The merged device tree of a multi-guest run
// ---------------------------------------------------------------------------

constexpr const char* kTreePrefix = "vrdma-run.";  // TMPDIR/vrdma-run.PID.XXXXXX

std::string temp_root() {
    const char* t = getenv("TMPDIR");
    return t && *t == '/' ? t : "/tmp";
}

// Removes a tree without ever following a symbolic link (the links of a
// merged tree point into the shims' published trees, which must stay) or
// resolving a path twice.
void remove_tree(const std::string& dir) {
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos) return;
    vrdma::UniqueFd parent(::open(slash == 0 ? "/" : dir.substr(0, slash).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (parent) vrdma::fs::remove_tree(parent.get(), dir.substr(slash + 1));
}

// Trees left by runs whose process is gone (the janitor was killed, or the
// machine stopped): removed at the next multi-guest start.
void sweep_stale_trees() {
    const std::string root = temp_root();
    DIR* d = ::opendir(root.c_str());
    if (!d) return;
    const size_t plen = std::strlen(kTreePrefix);
    while (dirent* e = ::readdir(d)) {
        if (std::strncmp(e->d_name, kTreePrefix, plen) != 0) continue;
        char* end = nullptr;
        long pid = std::strtol(e->d_name + plen, &end, 10);
        if (pid <= 0 || !end || *end != '.') continue;
        std::string path = root + "/" + e->d_name;
        struct stat st;
        if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) continue;
        if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // its program may still run
        remove_tree(path);
    }
    ::closedir(d);
}

bool read_first_line(const std::string& path, std::string& out) {
    std::ifstream f(path);
    if (!f || !std::getline(f, out)) return false;
    while (!out.empty() && (out.back() == '\r' || out.back() == ' ')) out.pop_back();
    return true;
}

bool write_text(const std::string& path, const std::string& text) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
    return ::close(fd) == 0 && ok;
}

// Builds the merged tree for `guests` (probed already) in a new private
// directory; returns its path, or "" with `error` set.
std::string build_merged_tree(const std::string& run_dir, const std::vector<std::string>& guests,
                              std::string& error) {
    std::string tmpl = temp_root() + "/" + kTreePrefix + std::to_string(::getpid()) + ".XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back(0);
    if (!::mkdtemp(buf.data())) {
        error = "cannot create a directory in " + temp_root() + ": " + std::strerror(errno);
        return "";
    }
    const std::string root(buf.data());
    auto fail = [&](const std::string& why) {
        error = why;
        remove_tree(root);
        return std::string();
    };
    const std::string verbs = root + "/class/infiniband_verbs";
    const std::string ib = root + "/class/infiniband";
    for (const std::string& d : {root + "/class", verbs, ib})
        if (::mkdir(d.c_str(), 0755) != 0) return fail("cannot create " + d + ": " + std::strerror(errno));

    std::set<std::string> uverbs_seen;
    for (size_t i = 0; i < guests.size(); ++i) {
        const std::string& g = guests[i];
        const std::string sys = vrdma::guest_paths(run_dir, g).sysfs;
        const std::string gverbs = sys + "/class/infiniband_verbs";
        if (i == 0) {
            std::string abi;
            if (!read_first_line(gverbs + "/abi_version", abi) || !write_text(verbs + "/abi_version", abi + "\n"))
                return fail("cannot copy " + gverbs + "/abi_version");
        }
        // The guest's one uverbs entry.
        std::vector<std::string> entries;
        if (DIR* d = ::opendir(gverbs.c_str())) {
            while (dirent* e = ::readdir(d)) {
                if (e->d_name[0] == '.') continue;
                struct stat st;
                std::string p = gverbs + "/" + e->d_name;
                if (::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) entries.push_back(e->d_name);
            }
            ::closedir(d);
        }
        if (entries.size() != 1)
            return fail("guest '" + g + "' publishes " + std::to_string(entries.size()) + " devices in " + gverbs +
                        ", expected one");
        const std::string& uv = entries[0];
        if (!uverbs_seen.insert(uv).second)
            return fail("guests publish the same device node " + uv + " twice");
        std::string ibdev, abi, dev;
        if (!read_first_line(gverbs + "/" + uv + "/ibdev", ibdev) ||
            !read_first_line(gverbs + "/" + uv + "/abi_version", abi) ||
            !read_first_line(gverbs + "/" + uv + "/dev", dev) || ibdev.empty() || ibdev.find('/') != std::string::npos)
            return fail("guest '" + g + "': unreadable device entry " + gverbs + "/" + uv);
        const std::string target = sys + "/class/infiniband/" + ibdev;
        if (!exists(target)) return fail("guest '" + g + "': no device directory " + target);
        const std::string name = "vrdma" + std::to_string(i);
        const std::string entry = verbs + "/" + uv;
        if (::mkdir(entry.c_str(), 0755) != 0 || !write_text(entry + "/ibdev", name + "\n") ||
            !write_text(entry + "/abi_version", abi + "\n") || !write_text(entry + "/dev", dev + "\n"))
            return fail("cannot write " + entry + ": " + std::strerror(errno));
        // A link, not a copy: the shim rewrites the port state in place.
        if (::symlink(target.c_str(), (ib + "/" + name).c_str()) != 0)
            return fail("cannot link " + ib + "/" + name + ": " + std::strerror(errno));
    }
    return root;
}

// Starts a detached process that removes `dir` once this process (which is
// about to become PROGRAM by exec: same pid) has ended. It holds none of our
// descriptors but a pidfd, so it never keeps a pipe of the caller open.
void start_janitor(const std::string& dir) {
    const pid_t me = ::getpid();
    int pidfd = int(::syscall(SYS_pidfd_open, me, 0));
    if (pidfd >= 0 && pidfd < 3) {  // keep it clear of the standard descriptors
        int moved = ::fcntl(pidfd, F_DUPFD_CLOEXEC, 3);
        ::close(pidfd);
        pidfd = moved;
    }
    pid_t mid = ::fork();
    if (mid == 0) {
        if (::fork() != 0) _exit(0);  // the janitor is nobody's child we know
        ::setsid();                   // terminal signals and hangups are not for it
        ::signal(SIGHUP, SIG_IGN);
        ::signal(SIGINT, SIG_IGN);
        ::signal(SIGPIPE, SIG_IGN);
        if (::chdir("/") != 0) _exit(1);
        int null = ::open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
        if (null > 2) ::close(null);
        int keep = pidfd >= 3 ? pidfd : INT_MAX;
        if (keep > 3) ::close_range(3, unsigned(keep - 1), 0);
        if (keep != INT_MAX) ::close_range(unsigned(keep + 1), ~0u, 0);
        if (pidfd >= 0) {
            pollfd p{pidfd, POLLIN, 0};
            while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
            }
        } else {
            while (::kill(me, 0) == 0 || errno != ESRCH) ::sleep(1);
        }
        remove_tree(dir);
        _exit(0);
    }
    if (mid > 0) ::waitpid(mid, nullptr, 0);
    if (pidfd >= 0) ::close(pidfd);
}

}  // namespace

int main(int argc, char** argv) {
    const char* env_dir = getenv("VRDMA_RUN_DIR");
    const char* env_guest = getenv("VRDMA_GUEST");
    std::string run_dir = env_dir && *env_dir ? env_dir : VRDMA_DEFAULT_RUN_DIR;
    std::vector<std::string> guests;  // in device order
    if (env_guest && *env_guest) guests = split_list(env_guest);
    bool guest_given = false;  // the first --guest replaces VRDMA_GUEST, later ones add
    auto add_guests = [&](const std::string& v) {
        if (!guest_given) guests.clear();
        guest_given = true;
        for (auto& n : split_list(v)) guests.push_back(n);
    };
    bool print_env = false;
    bool cdi = false;
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
        } else if (a == "--cdi") {
            cdi = true;
        } else if (a == "--run-dir") {
            if (i + 1 >= argc) return usage_error(a + " needs a value");
            run_dir = argv[++i];
        } else if (a == "--guest") {
            if (i + 1 >= argc) return usage_error(a + " needs a value");
            add_guests(argv[++i]);
        } else if (a.rfind("--run-dir=", 0) == 0) {
            run_dir = a.substr(10);
        } else if (a.rfind("--guest=", 0) == 0) {
            add_guests(a.substr(8));
        } else if (a == "--shim-user" || a.rfind("--shim-user=", 0) == 0) {
            std::string v;
            if (a == "--shim-user") {
                if (i + 1 >= argc) return usage_error(a + " needs a value");
                v = argv[++i];
            } else {
                v = a.substr(12);
            }
            uid_t uid;
            if (!parse_user(v, uid)) return usage_error("--shim-user: no user '" + v + "'");
            setenv("VRDMA_SHIM_UID", std::to_string(uid).c_str(), 1);
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
        guests = {names[size_t(rank) % names.size()]};
    }
    if (guests.empty() || (guests.size() == 1 && guests[0].empty()))
        return usage_error("no guest given (--guest NAME)");
    std::set<std::string> seen;
    for (auto& g : guests) {
        if (!vrdma::valid_guest_name(g))
            return usage_error("invalid guest name '" + g + "' (1-32 of A-Z a-z 0-9 _ . -)");
        if (!seen.insert(g).second) return usage_error("guest '" + g + "' given twice");
    }
    if (print_env && guests.size() > 1)
        return usage_error("--print-env takes one guest (a tree for several lives only as long as the program)");
    if (!print_env && !cdi && i >= argc) return usage_error("no program given");
    if (run_dir.empty() || run_dir[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof(cwd))) return usage_error("cannot resolve --run-dir");
        run_dir = std::string(cwd) + "/" + run_dir;
    }

    for (auto& g : guests) {
        bool refused = false, untrusted = false;
        std::string problem = vrdma::probe_guest(run_dir, g, &refused, &untrusted);
        if (!problem.empty()) {
            fprintf(stderr, "vrdma-run: %s\n", problem.c_str());
            return untrusted ? 5 : refused ? 4 : 3;
        }
    }
    Provider provider = find_provider();
    if (provider.library.empty()) {
        fprintf(stderr, "vrdma-run: the vrdma provider library is neither built (%s) nor installed (%s)\n",
                VRDMA_BUILD_PROVIDER, VRDMA_INSTALLED_PROVIDER);
        return 3;
    }

    if (cdi) return vrdma::tools::print_cdi_spec(run_dir, guests, provider, "vrdma-run");
    std::string sysfs = vrdma::guest_paths(run_dir, guests[0]).sysfs;
    if (guests.size() > 1) {
        sweep_stale_trees();
        std::string error;
        sysfs = build_merged_tree(run_dir, guests, error);
        if (sysfs.empty()) {
            fprintf(stderr, "vrdma-run: %s\n", error.c_str());
            return 3;
        }
    }
    auto env = guest_environment(run_dir, join(guests), sysfs, provider);
    if (print_env) {
        for (auto& e : env) printf("export %s='%s'\n", e.name.c_str(), e.value.c_str());
        return 0;
    }
    for (auto& e : env) setenv(e.name.c_str(), e.value.c_str(), 1);
    if (guests.size() > 1) start_janitor(sysfs);
    execvp(argv[i], argv + i);
    int e = errno;
    fprintf(stderr, "vrdma-run: cannot run %s: %s\n", argv[i], strerror(e));
    return 127;  // the janitor sees this process end and removes the tree
}
