// vrdmactl: inspect what a vrdma-shim serves; take a guest's port down or up.
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "vrdma_common/guest_paths.h"
#include "cdi_spec.h"
#include "vrdma_common/trusted_dir.h"

namespace {

constexpr const char* kHelp =
    "NAME\n"
    "    vrdmactl - inspect the guests served by a vrdma-shim\n"
    "\n"
    "SYNOPSIS\n"
    "    vrdmactl [--run-dir DIR] list\n"
    "    vrdmactl [--run-dir DIR] status\n"
    "    vrdmactl [--run-dir DIR] port GUEST down|up\n"
    "    vrdmactl [--run-dir DIR] weight GUEST W\n"
    "    vrdmactl [--run-dir DIR] guest add NAME[:OPTION...]\n"
    "    vrdmactl [--run-dir DIR] guest remove NAME [--grace SECONDS]\n"
    "    vrdmactl [--run-dir DIR] reload\n"
    "    vrdmactl [--run-dir DIR] cdi [GUEST...]\n"
    "    vrdmactl [--run-dir DIR] peers\n"
    "    vrdmactl [--run-dir DIR] counters\n"
    "    vrdmactl [--run-dir DIR] load\n"
    "    vrdmactl [--run-dir DIR] transports\n"
    "\n"
    "COMMANDS\n"
    "    list    One line per guest: name, LID, port GID, whether its shim\n"
    "            answers.\n"
    "    status  Whether a shim is running in DIR (its pid), then the list.\n"
    "            Exit status 0 if it is running, 3 if not.\n"
    "    port GUEST down|up\n"
    "            Takes port 1 of GUEST's vrdma0 down (its state becomes DOWN,\n"
    "            its RC and UD traffic stops, its processes get\n"
    "            IBV_EVENT_PORT_ERR) or up again (ACTIVE, IBV_EVENT_PORT_ACTIVE),\n"
    "            through the shim's control socket DIR/control.sock. Exit\n"
    "            status 0 on success, 1 if the shim refused, 3 if no shim\n"
    "            answers.\n"
    "    weight GUEST W\n"
    "            Gives GUEST weight W (1 to 16) from now on: its share of its\n"
    "            worker while the worker's other guests have work too, W\n"
    "            times that of a guest of weight 1 (vrdma-shim --guest\n"
    "            NAME:weight=W sets it at start; a restarted shim starts from\n"
    "            its command line again). vrdmactl load shows it. Exit status\n"
    "            0 on success, 1 if the shim refused (no such guest, a weight\n"
    "            out of range), 3 if no shim answers.\n"
    "    guest add NAME[:OPTION...]\n"
    "            Serves a new guest from now on, without a restart: NAME and\n"
    "            its options as vrdma-shim --guest takes them (owner=, group=,\n"
    "            pkeys=, controlled-qkeys, worker=, weight=). It gets the lowest\n"
    "            free LID of the shim's range (in a fabric: --lid-base and\n"
    "            --lid-count, so leave room there), the worker with the fewest\n"
    "            guests unless worker= says, and its device tree and socket in\n"
    "            DIR/NAME. Prints \"guest NAME lid L worker W\". A guest added\n"
    "            here is gone when the shim restarts. Exit status 0 on\n"
    "            success, 1 if the shim refused (a name in use, a bad option,\n"
    "            no free LID), 3 if no shim answers.\n"
    "    guest remove NAME\n"
    "            Stops serving guest NAME: its processes get\n"
    "            IBV_EVENT_DEVICE_FATAL and their verbs fail, the QPs connected\n"
    "            to its QPs get errors as when a guest dies, its memory and\n"
    "            objects are freed, and DIR/NAME goes. Other guests are not\n"
    "            disturbed. Its LID and name may be given to a guest added\n"
    "            later. With --grace SECONDS, the guest's port goes down first\n"
    "            (its processes get IBV_EVENT_PORT_ERR and can close their\n"
    "            devices), and the guest is removed as soon as none of its\n"
    "            processes has the device open, or when SECONDS are over.\n"
    "            Exit status as for guest add.\n"
    "    reload  Reads the shim's --config file again (as SIGHUP does) and\n"
    "            applies what can change while it runs: guests the file adds\n"
    "            are added, guests it no longer names are removed (guests\n"
    "            added with vrdmactl guest add are left alone), weights\n"
    "            follow. Anything else that changed needs a restart and is\n"
    "            refused, as is a change of a running guest's owner, group,\n"
    "            partitions or worker. Prints one line per change (added,\n"
    "            removed, weight) and per refusal. Exit status 0 if all was\n"
    "            applied, 1 if anything was refused or the file is wrong\n"
    "            (then nothing changed), 3 if no shim answers.\n"
    "    cdi [GUEST...]\n"
    "            Prints a Container Device Interface spec (JSON, CDI 0.5.0,\n"
    "            kind vrdma.dev/guest) with one device per guest named, or per\n"
    "            guest published in DIR: saved as /etc/cdi/vrdma.json, a\n"
    "            container gets guest NAME's vrdma0 with --device\n"
    "            vrdma.dev/guest=NAME (podman, containerd, CRI-O). Each device\n"
    "            sets the environment vrdma-run sets, mounts the guest's\n"
    "            directory and the provider read-only at the same paths and\n"
    "            makes the uverbs node. The image needs rdma-core's libibverbs\n"
    "            with provider ABI 34 (Debian 12's libibverbs1). Exit status 3\n"
    "            when there is no such guest.\n"
    "    peers   The peer shims of the fabric, one line per connection:\n"
    "              peer ADDR:PORT state STATE lids FIRST-LAST tx_bytes N rx_bytes N\n"
    "              tx_msgs N rx_msgs N retries N errors N\n"
    "              [worker I peer_worker K] [last_error \"TEXT\"]\n"
    "            Each worker of a shim has a connection to each worker of\n"
    "            each peer (worker I of this shim, K of the peer; shown when\n"
    "            either side runs more than one).\n"
    "            STATE is up, connecting (being dialed, or waiting to be\n"
    "            dialed again), down (it had connected to this shim and went\n"
    "            away) or refused (wrong key, or its LIDs overlap). Counters\n"
    "            add up over the peer's connections. \"no fabric\" when the\n"
    "            shim runs alone. Exit status 3 if no shim answers.\n"
    "    counters\n"
    "            What tenant isolation stopped since the shim started, one\n"
    "            line per guest, then one per live QP with a nonzero count:\n"
    "              guest NAME remote_access_errors N stranger_requests N\n"
    "                pkey_violations N refused_connections N throttled_requests N\n"
    "                qkey_violations N throttled_datagrams N\n"
    "              qp NAME QPN remote_access_errors N stranger_requests N\n"
    "            remote_access_errors: requests to the guest's QPs with an\n"
    "            rkey, address range or access its MRs and QPs do not grant\n"
    "            (the requester got IBV_WC_REM_ACCESS_ERR); stranger_requests:\n"
    "            requests dropped because they came from a QP other than the\n"
    "            one (and its incarnation) the target QP is connected to;\n"
    "            pkey_violations: requests and datagrams dropped because the\n"
    "            sender shares no partition (P_Key) with the target QP;\n"
    "            refused_connections: connections to the guest's socket by a\n"
    "            user who does not own it (vrdma-shim --guest NAME:owner=);\n"
    "            throttled_requests: RDMA and atomic requests to the guest\n"
    "            dropped unexamined because their source made more remote\n"
    "            access errors than vrdma-shim --rkey-guess-limit allows;\n"
    "            qkey_violations: UD datagrams to the guest's QPs dropped\n"
    "            because their qkey was wrong; throttled_datagrams: UD\n"
    "            datagrams to the guest dropped unexamined because their\n"
    "            source sent it more with a wrong qkey than vrdma-shim\n"
    "            --qkey-guess-limit allows.\n"
    "            The shim also logs each kind, at most once a second per\n"
    "            guest. Exit status 3 if no shim answers.\n"
    "    transports\n"
    "            How the shim moved payloads since it started, one line per\n"
    "            transport, with the bytes of payload its CPU copied:\n"
    "              local copied_bytes N\n"
    "              worker A->B requests N copied_bytes N ring_full N\n"
    "              tcp copied_bytes N\n"
    "              hca DEVICE:PORT sends N send_bytes N recvs N completions N\n"
    "                errors N copied_bytes 0\n"
    "            local: copies between guests of one worker; worker A->B\n"
    "            (with vrdma-shim --workers 2 or more): requests and slices\n"
    "            worker A handed to worker B, the payload bytes worker A\n"
    "            copied for the requests B handed it, and the requests that\n"
    "            found B's inbox full (back-pressure); tcp (only in a\n"
    "            fabric: vrdma-shim --fabric-*): the bytes\n"
    "            of the fabric's connections, in and out (every one passes\n"
    "            through the CPU); hca (only with vrdma-shim --hca): work\n"
    "            requests and payload bytes posted on the device, receives\n"
    "            posted, device completions and those in error. The device\n"
    "            moves its payloads by DMA: the shim has no code that copies\n"
    "            them, and the count is 0 by construction. Exit status 3 if\n"
    "            no shim answers.\n"
    "    load    Who uses the shim since it started: one line per worker\n"
    "            thread (vrdma-shim --workers), then one per guest:\n"
    "              worker K guests N contexts N passes N busy_s S asleep_s S\n"
    "                uptime_s S\n"
    "              guest NAME contexts N turns N messages N bytes N busy_s S\n"
    "                qp_visits N worker K weight W\n"
    "            busy_s: seconds spent in turns that found work (a guest's:\n"
    "            the turns of its contexts, control commands included);\n"
    "            asleep_s: seconds the worker slept with nothing to do (the\n"
    "            rest of uptime_s went to polling, the fabric and attaches);\n"
    "            turns: passes over one of the guest's contexts that found\n"
    "            work; messages and bytes: what the guest's QPs sent, over\n"
    "            every transport, a resent message counted once; qp_visits:\n"
    "            QPs its turns looked at for work (a QP is looked at when its\n"
    "            guest or the shim says it has work: idle QPs and control\n"
    "            commands add none, except in a context with an SRQ); weight:\n"
    "            the guest's share of its worker (vrdma-shim --guest\n"
    "            NAME:weight=W). Each turn is bounded (docs/protocol.md,\n"
    "            \"Work per turn\"), so a guest with a large busy_s is one that\n"
    "            keeps asking, not one that holds the others up; when guests\n"
    "            of one worker all keep asking, their busy_s go as their\n"
    "            weights. Exit status 3 if no shim answers.\n"
    "\n"
    "OPTIONS\n"
    "    --run-dir DIR  The shim's run directory. Default: VRDMA_RUN_DIR, else\n"
    "                   /run/vrdma.\n"
    "    -h, --help     Show this text.\n";

std::string read_line(const std::string& path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

std::vector<std::string> guests_in(const std::string& run_dir) {
    std::vector<std::string> out;
    DIR* d = opendir(run_dir.c_str());
    if (!d) return out;
    while (dirent* e = readdir(d)) {
        std::string n = e->d_name;
        if (vrdma::valid_guest_name(n) &&
            access(vrdma::guest_paths(run_dir, n).device_dir.c_str(), F_OK) == 0)
            out.push_back(n);
    }
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

int list(const std::string& run_dir) {
    auto guests = guests_in(run_dir);
    if (guests.empty()) {
        printf("no guests published in %s\n", run_dir.c_str());
        return 0;
    }
    printf("%-16s %-6s %-40s %s\n", "GUEST", "LID", "GID", "SHIM");
    for (auto& g : guests) {
        auto p = vrdma::guest_paths(run_dir, g);
        std::string port = p.device_dir + "/ports/1/";
        bool alive = vrdma::probe_guest(run_dir, g).empty();
        printf("%-16s %-6s %-40s %s\n", g.c_str(), read_line(port + "lid").c_str(),
               read_line(port + "gids/0").c_str(), alive ? "answering" : "NOT ANSWERING");
    }
    return 0;
}

// vrdmactl cdi [GUEST...]: the CDI spec of the guests named, else of every
// guest published in the run directory.
int cdi(const std::string& run_dir, std::vector<std::string> guests) {
    if (guests.empty()) guests = guests_in(run_dir);
    if (guests.empty()) {
        fprintf(stderr, "vrdmactl: no guests published in %s\n", run_dir.c_str());
        return 3;
    }
    const vrdma::tools::Provider provider = vrdma::tools::find_provider();
    if (provider.library.empty()) {
        fprintf(stderr, "vrdmactl: the vrdma provider library is neither built nor installed\n");
        return 3;
    }
    return vrdma::tools::print_cdi_spec(run_dir, guests, provider, "vrdmactl");
}

// One request to the shim's control socket (src/shim/daemon/control_socket.h):
// 0 with the shim's reply, or 3 (said on stderr) when no shim answers.
int ask(const std::string& run_dir, const std::string& request, std::string& reply) {
    std::string path = run_dir + "/control.sock";
    vrdma::UniqueFd sock;
    std::string why;
    switch (vrdma::connect_to_shim(path, sock, why, nullptr, 1)) {
    case vrdma::ShimConnect::Ok:
        break;
    case vrdma::ShimConnect::Untrusted:
        fprintf(stderr, "vrdmactl: not talking to %s: %s\n", path.c_str(), why.c_str());
        return 3;
    case vrdma::ShimConnect::ConnectFailed:
        fprintf(stderr, "vrdmactl: no vrdma-shim answers on %s: %s\n", path.c_str(), why.c_str());
        return 3;
    }
    int fd = sock.release();
    static char buf[1 << 16];
    ssize_t n = -1;
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) == ssize_t(request.size())) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 5000) == 1) n = recv(fd, buf, sizeof(buf) - 1, 0);
    }
    close(fd);
    if (n <= 0) {
        fprintf(stderr, "vrdmactl: no reply from the vrdma-shim on %s\n", path.c_str());
        return 3;
    }
    reply.assign(buf, size_t(n));
    return 0;
}

// A request whose reply is "ok", an answer (`print_reply`: printed as it
// is), or "error: ..." (exit status 1).
int control(const std::string& run_dir, const std::string& request, bool print_reply = false) {
    std::string reply;
    if (int rc = ask(run_dir, request, reply)) return rc;
    if (reply == "ok") return 0;
    if (print_reply && reply.rfind("error: ", 0) != 0) {
        fputs(reply.c_str(), stdout);
        return 0;
    }
    fprintf(stderr, "vrdmactl: %s\n", reply.c_str());
    return 1;
}

// The contexts guest `name` has attached now (vrdmactl load), -1 if unknown.
long guest_contexts(const std::string& run_dir, const std::string& name) {
    std::string reply;
    if (ask(run_dir, "load", reply)) return -1;
    const std::string head = "guest " + name + " contexts ";
    for (size_t pos = 0; (pos = reply.find(head, pos)) != std::string::npos; pos += head.size())
        if (pos == 0 || reply[pos - 1] == '\n') return std::strtol(reply.c_str() + pos + head.size(), nullptr, 10);
    return -1;
}

// guest remove NAME --grace SECONDS: the port goes down first (its
// processes get IBV_EVENT_PORT_ERR and may close their devices); the guest
// is removed once it has no context left, or when the grace is over.
int remove_with_grace(const std::string& run_dir, const std::string& name, double grace_s) {
    if (int rc = control(run_dir, "port " + name + " down")) return rc;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    long left = guest_contexts(run_dir, name);
    while (left > 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        left = guest_contexts(run_dir, name);
    }
    if (left > 0)
        fprintf(stderr, "vrdmactl: guest %s still has %ld context(s) after %g s: removing it now\n", name.c_str(), left,
                grace_s);
    return control(run_dir, "guest remove " + name);
}

}  // namespace

int main(int argc, char** argv) {
    const char* env_dir = getenv("VRDMA_RUN_DIR");
    std::string run_dir = env_dir && *env_dir ? env_dir : VRDMA_DEFAULT_RUN_DIR;
    std::string cmd;
    std::vector<std::string> args;
    double grace = -1;  // guest remove --grace SECONDS
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            fputs(kHelp, stdout);
            return 0;
        } else if (a == "--run-dir" && i + 1 < argc) {
            run_dir = argv[++i];
        } else if (cmd.empty() && a[0] != '-') {
            cmd = a;
        } else if ((cmd == "port" || cmd == "weight" || cmd == "guest") && args.size() < 2 && a[0] != '-') {
            args.push_back(a);
        } else if (cmd == "cdi" && a[0] != '-') {
            if (!vrdma::valid_guest_name(a)) {
                fprintf(stderr, "vrdmactl: invalid guest name '%s'\n", a.c_str());
                return 2;
            }
            args.push_back(a);
        } else if (cmd == "guest" && (a == "--grace" || a.rfind("--grace=", 0) == 0)) {
            std::string v = a == "--grace" ? (i + 1 < argc ? argv[++i] : "") : a.substr(8);
            char* end = nullptr;
            grace = std::strtod(v.c_str(), &end);
            if (v.empty() || !end || *end || grace < 0 || grace > 3600) {
                fprintf(stderr, "vrdmactl: --grace wants 0 to 3600 seconds, not '%s'\n", v.c_str());
                return 2;
            }
        } else {
            fprintf(stderr, "vrdmactl: unexpected argument '%s' (see vrdmactl --help)\n", a.c_str());
            return 2;
        }
    }
    if (cmd == "list") return list(run_dir);
    if (cmd == "port") {
        if (args.size() != 2 || (args[1] != "up" && args[1] != "down")) {
            fprintf(stderr, "vrdmactl: usage: vrdmactl port GUEST down|up\n");
            return 2;
        }
        return control(run_dir, "port " + args[0] + " " + args[1]);
    }
    if (cmd == "weight") {
        if (args.size() != 2) {
            fprintf(stderr, "vrdmactl: usage: vrdmactl weight GUEST W (1 to 16)\n");
            return 2;
        }
        return control(run_dir, "weight " + args[0] + " " + args[1]);
    }
    if (cmd == "guest") {
        if (args.size() != 2 || (args[0] != "add" && args[0] != "remove") ||
            args[1].find_first_of(" \t\n") != std::string::npos) {
            fprintf(stderr, "vrdmactl: usage: vrdmactl guest add NAME[:OPTION...] | guest remove NAME\n");
            return 2;
        }
        if (grace >= 0 && args[0] != "remove") {
            fprintf(stderr, "vrdmactl: --grace is for guest remove\n");
            return 2;
        }
        if (grace > 0) return remove_with_grace(run_dir, args[1], grace);
        return control(run_dir, "guest " + args[0] + " " + args[1], args[0] == "add");
    }
    if (cmd == "reload") return control(run_dir, "reload", true);
    if (cmd == "cdi") return cdi(run_dir, args);
    if (cmd == "peers") return control(run_dir, "peers", true);
    if (cmd == "counters") return control(run_dir, "counters", true);
    if (cmd == "load") return control(run_dir, "load", true);
    if (cmd == "transports") return control(run_dir, "transports", true);
    if (cmd == "status") {
        std::string pid = read_line(run_dir + "/ready");
        if (pid.empty()) {
            printf("no vrdma-shim is ready in %s\n", run_dir.c_str());
            return 3;
        }
        printf("vrdma-shim pid %s serves %s\n", pid.c_str(), run_dir.c_str());
        return list(run_dir);
    }
    fprintf(stderr, "vrdmactl: %s (see vrdmactl --help)\n",
            cmd.empty() ? "no command given" : ("unknown command '" + cmd + "'").c_str());
    return 2;
}
