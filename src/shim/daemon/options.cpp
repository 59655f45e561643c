#include "options.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "config_file.h"
#include "vrdma_common/ipv4_endpoint.h"
#include "transport_registry.h"
#include "quota.h"
#include "vrdma/vm_abi.h"
#include "vrdma_common/guest_paths.h"

namespace vrdma::shim {

namespace {

const char* help_template() {
    return R"(NAME
    vrdma-shim - host daemon serving virtual RDMA devices (vrdma0) to local guests

SYNOPSIS
    vrdma-shim [--config FILE] [--run-dir DIR] --guest NAME[:owner=USER][:group=GROUP][:pkeys=P,...][:controlled-qkeys]
               [:worker=K][:weight=W][:ip=ADDR,...] [--guest ...] [--workers N] [--worker-cpus LIST]
               [--idle-yield auto|always]
               [--lid-base N] [--lid-count N]
               [--attach-timeout SECONDS]
               [--rkey-guess-limit N] [--qkey-guess-limit N]
               [--quota KEY=VALUE ...] [--log-level error|warn|info|debug]
               [--metrics-listen ADDR:PORT]
@TRANSPORT_SYNOPSIS@    vrdma-shim --help

DESCRIPTION
    vrdma-shim gives every guest (a tenant: a process, container or VM run
    through vrdma-run) an InfiniBand device named vrdma0 that unmodified
    libibverbs applications can use. Control verbs arrive on a command ring
    in memory shared with the guest's provider library; work requests are
    executed by the shim, which moves data between guests of this host by
    memory copy, and to guests of other hosts through their shims over TCP
    (the fabric). Every value read from a guest or a peer shim is
    validated; a guest cannot reach another guest's memory except through a
    memory region the other registered for remote access.

    Several shims, one per host, form one InfiniBand-like fabric: each owns
    a range of LIDs (--lid-base, --lid-count) and (LID, QPN) names a QP
    fabric-wide, so a guest cannot tell a peer on another host from one on
    its own, except by speed. Shims authenticate each other with a shared
    key; a peer whose LIDs overlap this shim's or another peer's is refused.
    Example, two hosts:
        host1$ vrdma-shim --guest a --lid-base 1 --fabric-listen 10.0.0.1:7400 \
                   --fabric-peer 10.0.0.2:7400 --fabric-key /etc/vrdma/fabric.key
        host2$ vrdma-shim --guest b --lid-base 2 --fabric-listen 10.0.0.2:7400 \
                   --fabric-peer 10.0.0.1:7400 --fabric-key /etc/vrdma/fabric.key

OPTIONS
    --config FILE
        Read options from FILE, a TOML file whose keys are the long options
        without "--" (run-dir = "/run/vrdma", workers = 2, hca-local = true;
        [fabric] listen/peer/key/... for --fabric-*, [quota] KEY = N for
        --quota, one [[guest]] table per guest with name, owner, group,
        pkeys, controlled-qkeys, worker, weight, ip = ["10.0.0.1"]). It can say everything
        the command line can; the command line overrides it (a --guest
        there replaces the file's guest of that name, --fabric-peer there
        replaces the file's peers). An error names the file and line.
        vrdmactl reload or SIGHUP reads it again and applies what can
        change while the shim runs (guests added and removed, weights);
        anything else is refused with the reason. Example:
            run-dir = "/run/vrdma"
            [[guest]]
            name = "a"
            owner = "alice"
            weight = 2

    --run-dir DIR
        Directory where the shim publishes its guests (default /run/vrdma).
        Created if missing (mode 0755). Only one shim may serve a run
        directory. It must belong to the shim's user and be writable by
        nobody else, and so must each directory above it, except that an
        ancestor others may write is accepted when its sticky bit is set
        (as /tmp's is); otherwise the shim refuses to start, naming the
        directory and the owner or mode at fault. A link in DIR is resolved
        once at start (the log shows the real path); from then on every
        file the shim writes, reads or removes is reached through directory
        fds opened without following links.

    --guest NAME[:owner=USER|UID][:group=GROUP|GID][:pkeys=P[,P...]][:controlled-qkeys][:worker=K][:weight=W]
            [:ip=ADDR[,ADDR...]][:vm[:vm-memory=SIZE]]
        Serve a guest named NAME (1-32 characters of A-Z a-z 0-9 _ . -, not
        "." or ".."). Repeat for more guests; names must be unique. At least
        one is required. Guests get LIDs in the order given. More can be
        added, and any removed, while the shim runs: vrdmactl guest add
        NAME[:...] and vrdmactl guest remove NAME.
        Only the guest's owner, members of its group and root may use it.
        The owner defaults to the user the shim runs as, and there is no
        group unless given: the guest's socket DIR/NAME/vrdma.sock belongs
        to the owner with mode 0600 (0660, group GROUP, when a group is
        given); DIR/NAME and the device tree in it stay the shim's (mode
        0755, readable by all as the kernel's sysfs is), so the owner can
        change nothing in them. Every connection's peer credentials (SO_PEERCRED)
        are checked when it is accepted, before anything is charged to
        the guest; a refused one gets an EACCES reply, is closed, and is
        logged (at most once a second per guest, with the count). Giving a
        guest to another user needs a shim run as root. Example:
            vrdma-shim --guest a:owner=alice --guest b:owner=bob:group=rdma
        :pkeys=P[,P...] puts the guest in partitions: P_Keys (1 to 16) as
        on InfiniBand, the low 15 bits naming a partition (0x0001-0x7fff),
        bit 15 set for a full member (0x8001) and clear for a limited one
        (0x0001). They are the port's P_Key table (sysfs pkeys/N,
        ibv_query_pkey) in the order given; a QP's pkey_index picks one.
        Traffic between two QPs of this shim passes only when their P_Keys
        name the same partition and at least one is a full member; other
        requests and datagrams are dropped (RC requesters end in
        IBV_WC_RETRY_EXC_ERR) and counted (vrdmactl counters). Default: the
        default partition, 0xffff, which every guest without :pkeys is in.
        Across the fabric, a peer shim announces its guests' partitions,
        and a request from a peer's guest whose P_Key that guest is not a
        member of is dropped and counted (vrdmactl peers: foreign_pkey).
        :controlled-qkeys lets the guest give its UD QPs a controlled qkey
        (the high bit set, 0x80000000 and up), which InfiniBand reserves
        to privileged consumers (such as the subnet administrator's GSI
        users); without it ibv_modify_qp with such a qkey fails with EPERM,
        as it does for an unprivileged process on Linux.
        :worker=K has worker K (0 to --workers minus 1) serve the guest;
        without it guests are dealt to the workers in turn, in the order
        given (see --workers).
        :weight=W (1 to 16, default 1) is the guest's share of its worker
        while other guests of that worker have work too: each pass over
        the worker's guests gives it W times the work of a guest of weight
        1 (a turn is about 10 microseconds of the worker's time per unit
        of weight). A guest alone on its worker gets all of it whatever
        its weight. vrdmactl weight NAME W changes it while the shim
        runs; vrdmactl load shows each guest's weight and busy_s.
        :ip=ADDR[,ADDR...] gives the guest IP addresses (1 to 16, IPv4 or
        IPv6, each guest's its own) for rdma_cm: librdmacm programs run
        under vrdma-run (rping, ucmatose, perftest -R) bind, listen on and
        connect to them by address and port, and an address resolves to
        the guest that has it. Every guest also has the loopback addresses
        (127.0.0.1, ::1) and the wildcard, which mean the guest itself. A
        guest may bind only its own addresses. Example:
            vrdma-shim --guest a:ip=10.0.0.1 --guest b:ip=10.0.0.2,fd00::2
        :vm makes the guest a QEMU virtual machine's (docs/protocol.md "VM
        tenants"): the shim serves its device on DIR/NAME/ivshmem.sock,
        which one QEMU at a time connects to with
            -chardev socket,path=DIR/NAME/ivshmem.sock,id=vrdma
            -device ivshmem-doorbell,chardev=vrdma,vectors=2
        and vrdma-vm-agent inside the VM (as root, no kernel module) serves
        vrdma0 to the VM's processes. :vm-memory=SIZE (implies :vm) is the
        device's memory, which holds every ring and registered buffer of
        the VM: a power of two from 4M to 64G (suffix k, M or G), default
        64M. The owner and group apply to ivshmem.sock: QEMU's user must be
        allowed. The VM's going (QEMU exits or is killed) frees everything
        it held.

    --workers N
        Worker threads that serve the guests (1..64). Each worker serves
        its share of the guests (all processes of a guest on one worker)
        and polls while they have work, sleeping when they have none;
        guests of two workers still talk to each other (every verb, with
        the same semantics), each message crossing from one worker to the
        other through a lock-free ring, which costs latency against two
        guests of one worker. Put guests that talk most on one worker
        (:worker=K), or give heavy tenants workers of their own. Default:
        half the CPUs the shim may run on (its affinity mask), at least
        1: the guests' own pollers need the other half. In a fabric
        (--fabric-*) each worker has its own connection to each worker
        of every peer shim, and carries its guests' traffic across it.
        With a device (--hca) each worker opens the device for itself:
        its guests' device objects and completion queues are its own.

    --worker-cpus LIST
        Pins worker K to the K-th CPU of LIST (CPU numbers and ranges, as
        taskset -c takes them: 2,3 or 4-7), one CPU per worker, each one the
        shim may run on; without --workers, the shim runs one worker per
        CPU listed. A pinned worker polls only its CPU: give it a core the
        guests' processes do not use, or pin the guests it serves beside it
        (taskset), so that a busy tenant's worker and processes share cores
        with nobody else's. Default: not pinned.

    --idle-yield auto|always
        Between messages a worker keeps polling for a tenth of a
        millisecond before it sleeps. With always, it gives its CPU away
        (sched_yield) after each such pass, so that a guest's process on
        the same CPU runs at once. With auto (the default), it does so
        only while the host has more runnable threads than the shim has
        CPUs (the kernel's count, read every 10 ms): where every thread
        has a core the yield gives the CPU to nobody and costs a system
        call of about half a microsecond, which a message arriving then
        waits for. Pinned workers (--worker-cpus) always yield, since
        the guests pinned beside them are not seen in a host-wide count.
        Use always where guests' processes are pinned to the CPUs of
        unpinned workers.

    --lid-base N
        LID of the first guest (default 1); the guest at position i (from 0)
        gets LID N+i. LIDs must stay in the unicast range 1..0xbfff.

    --attach-timeout SECONDS
        A connection to a guest's socket that has not attached after
        SECONDS (default 10, 1..3600) is closed, when the next connection
        to any guest arrives: a process that opens connections and never
        attaches holds its guest's connection quota only that long. The
        provider attaches within milliseconds of connecting.

    --rkey-guess-limit N
        Remote access errors (a wrong rkey, address range or access in an
        RDMA or atomic request: the requester gets IBV_WC_REM_ACCESS_ERR)
        that one source, a guest of this shim or of a peer shim known by
        its LID, may cause: N at once, then N a second (default 32,
        0..1000000; 0 turns throttling off). A source over the limit has
        its RDMA and atomic requests to this shim's guests dropped
        unexamined (its QPs see lost packets and, after their timeout,
        IBV_WC_RETRY_EXC_ERR) until it has kept below the rate; SENDs are
        not affected. Correct programs make no remote access errors: each
        one puts both QPs in error. Counted as throttled_requests in
        vrdmactl counters and logged.

    --qkey-guess-limit N
        UD datagrams with a wrong qkey that one source (a guest of this
        shim or of a peer shim, known by its LID) may send to one guest of
        this shim: N at once, then N a second (default 32, 0..1000000; 0
        turns throttling off). Over the limit, all its datagrams to that
        guest are dropped unexamined, whatever their qkey, until it has
        kept below the rate; its datagrams to other guests are not
        affected. Correct programs send no datagram with a wrong qkey.
        Counted as qkey_violations and throttled_datagrams in vrdmactl
        counters and logged.

    --lid-count N
        How many LIDs this shim owns from --lid-base (default: one per
        guest). The fabric refuses a peer whose range overlaps this one.
        Guests added at run time (vrdmactl guest add) take free LIDs of
        this range; a shim outside a fabric without --lid-count takes any
        free LID from --lid-base on.

    --metrics-listen ADDR:PORT
        Serve the shim's counters to Prometheus at http://ADDR:PORT/metrics
        (text format 0.0.4): per worker its guests, contexts, passes, busy
        and asleep seconds; per guest its contexts, weight, turns, messages,
        bytes and busy seconds, and what tenant isolation stopped (the
        counters of vrdmactl counters, as vrdma_guest_*_total). Guest
        names are visible to whoever reaches the port: listen on
        127.0.0.1, or on an address only the monitoring network reaches.

@TRANSPORT_OPTIONS@    --quota KEY=VALUE
        Limits what each guest (all of its processes together) may make the
        shim hold; repeat for several keys. VALUE is a number, optionally
        with a k, M, G or T suffix (powers of 1024). Past a limit the verb
        fails with ENOMEM (a refused connection is closed) and the shim logs
        a warning (at most one a second per guest and key). Keys and defaults:
            connections 256    sockets open to the guest's socket (one per
                               process using the device, and per context)
            pd 65536  mr 262144  mw 262144  cq 16384  qp 16384  srq 8192
            ah 65536
            mr_bytes 1T        registered memory (sum of MR lengths)
            wr 4M              work-queue entries of all QPs and SRQs
            mappings 16384     mmap()s of guest memory: one per memory
                               segment, 1 + pieces per MR over several
            map_bytes 2T       bytes of guest memory mapped
        The device attributes a guest queries report the pd, mr, mw, cq,
        qp, srq and ah limits. All guests together also stay below the
        kernel's vm.max_map_count less 8192.

    --log-level LEVEL
        error, warn, info (default) or debug. Logs go to standard error.

    --help
        Print this text and exit.

FILES
    DIR/shim.pid
        The shim's pid, locked while it runs (a second shim is refused).
    DIR/ready
        Created (containing the pid) once every guest is published.
    DIR/NAME/sys/
        The guest's sysfs tree (its SYSFS_PATH): class/infiniband_verbs/
        uverbs_vrdma_NAME_HASH and class/infiniband/vrdma0 with node and port
        attributes, and vrdma_socket naming the guest's socket.
    DIR/NAME/vrdma.sock
        The guest's SOCK_SEQPACKET socket (attach handshake, memory
        segments, event file descriptors).
    /dev/infiniband/uverbs_vrdma_NAME_HASH
        A symbolic link to /dev/null that libibverbs opens.

    Stale files of a shim that died are replaced at start. Everything listed
    here is removed at exit.

OUTPUT
    When ready, one line on standard output:
        vrdma-shim: ready: guests a(lid 1) b(lid 2) run-dir DIR
    (with a fabric, followed by "fabric lids FIRST-LAST"). Peers come up
    after that, asynchronously: vrdmactl --run-dir DIR peers shows them.

SIGNALS
    SIGTERM, SIGINT
        Clean shutdown: every attached guest context is marked fatal, all
        sockets are closed and every published file is removed.

EXIT STATUS
    0   clean shutdown after SIGTERM or SIGINT, or --help
    1   runtime failure (run directory in use by another live shim, files
        that cannot be created, ...)
    2   wrong usage
)";
}

void replace_marker(std::string& text, const std::string& marker, const std::string& with) {
    const size_t at = text.find(marker);
    if (at != std::string::npos) text.replace(at, marker.size(), with);
}

}  // namespace

// The transports' options (transport_registry.h) go where the markers are:
// a synopsis line each, and their paragraphs among the options.
std::string help_text() {
    std::string synopsis, paragraphs;
    for (const TransportFactory* f : transport_factories()) {
        std::string line = "               ";
        for (const TransportOption& o : f->options) {
            line += std::string(line.size() > 15 ? " " : "") + "[" + o.name;
            if (o.value) line += std::string(" ") + o.value;
            line += o.repeatable ? " ...]" : "]";
            paragraphs += std::string("    ") + o.name + (o.value ? std::string(" ") + o.value : "") + "\n" + o.help + "\n";
        }
        synopsis += line + "\n";
    }
    std::string text = help_template();
    replace_marker(text, "@TRANSPORT_SYNOPSIS@", synopsis);
    replace_marker(text, "@TRANSPORT_OPTIONS@", paragraphs);
    return text;
}

namespace {

bool parse_u32(const char* s, uint32_t& out) {
    if (!*s) return false;
    char* end;
    errno = 0;
    unsigned long v = std::strtoul(s, &end, 0);
    if (*end || errno || v > 0xffffffffUL || s[0] == '-') return false;
    out = uint32_t(v);
    return true;
}

}  // namespace

bool parse_weight(const std::string& text, uint32_t& weight) {
    return parse_u32(text.c_str(), weight) && weight >= 1 && weight <= kMaxGuestWeight;
}

namespace {

// Calls `item` with each comma-separated part of `list` (empty ones too);
// false as soon as it returns false.
template <typename F>
bool each_item(const std::string& list, F item) {
    for (size_t start = 0; start <= list.size();) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        if (!item(list.substr(start, comma - start))) return false;
        start = comma + 1;
    }
    return true;
}

// "0x8001,0x0002": 1-16 P_Keys, each naming a partition (low 15 bits not 0).
bool parse_pkeys(const std::string& list, std::vector<uint16_t>& out) {
    out.clear();
    return each_item(list,
                     [&](const std::string& part) {
                         uint32_t v;
                         if (!parse_u32(part.c_str(), v) || v > 0xffff || (v & 0x7fff) == 0) return false;
                         out.push_back(uint16_t(v));
                         return true;
                     }) &&
           !out.empty() && out.size() <= kMaxPkeys;
}

// "0,2-3": CPU numbers and ranges, each CPU once, at most kMaxWorkers.
bool parse_cpu_list(const std::string& list, std::vector<uint32_t>& out) {
    out.clear();
    return each_item(list,
                     [&](const std::string& part) {
                         const size_t dash = part.find('-');
                         uint32_t first, last;
                         if (dash == std::string::npos) {
                             if (!parse_u32(part.c_str(), first)) return false;
                             last = first;
                         } else if (!parse_u32(part.substr(0, dash).c_str(), first) ||
                                    !parse_u32(part.substr(dash + 1).c_str(), last) || last < first) {
                             return false;
                         }
                         for (uint32_t c = first; c <= last; ++c) {
                             if (out.size() >= kMaxWorkers || c >= 4096 ||
                                 std::find(out.begin(), out.end(), c) != out.end())
                                 return false;
                             out.push_back(c);
                         }
                         return true;
                     }) &&
           !out.empty();
}

}  // namespace

uint32_t default_workers() {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    return std::clamp<uint32_t>(uint32_t(cpus / 2), 1, kMaxWorkers);
}

bool parse_guest_arg(const std::string& arg, Options& o, std::string& error) {
    std::string g = arg;
    GuestAccess acc;
    const auto colon = g.find(':');
    std::string spec = colon == std::string::npos ? "" : g.substr(colon + 1);
    bool qkeys = false;
    int worker = -1;
    uint32_t weight = 1;
    uint64_t vm_memory = 0;  // :vm, :vm-memory=SIZE: a VM guest
    std::vector<uint16_t> table;
    std::vector<cm::IpAddress> addrs;
    std::string rest;  // the spec without :controlled-qkeys, for GuestAccess
    for (size_t start = 0; start < spec.size();) {
        size_t end = spec.find(':', start);
        if (end == std::string::npos) end = spec.size();
        // An IPv6 address has colons of its own: ip= runs on to the next
        // part that starts as one of the other keys.
        if (spec.compare(start, 3, "ip=") == 0) {
            static const char* const kKeys[] = {"owner=", "group=",  "pkeys=",     "controlled-qkeys", "worker=",
                                                "weight=", "ip=",    "vm-memory=", "vm"};
            while (end < spec.size()) {
                bool key = false;
                for (const char* k : kKeys) key = key || spec.compare(end + 1, std::strlen(k), k) == 0;
                if (key) break;
                end = spec.find(':', end + 1);
                if (end == std::string::npos) end = spec.size();
            }
        }
        std::string part = spec.substr(start, end - start);
        if (part.rfind("ip=", 0) == 0) {
            std::string why;
            if (!addrs.empty() || !cm::parse_ip_list(part.substr(3), addrs, why)) {
                error = "--guest " + g + ": ip= wants the guest's IP addresses for rdma_cm, ADDR[,ADDR...]: " +
                        (why.empty() ? "given twice" : why);
                return false;
            }
        } else if (part == "controlled-qkeys") {
            qkeys = true;
        } else if (part == "vm") {
            if (!vm_memory) vm_memory = abi::kVmDefaultMemory;
        } else if (part.rfind("vm-memory=", 0) == 0) {
            if (!parse_size(part.substr(10), vm_memory) || vm_memory < abi::kVmMinMemory ||
                vm_memory > abi::kVmMaxMemory || (vm_memory & (vm_memory - 1))) {
                error = "--guest " + g + ": vm-memory= wants a power of two from 4M to 64G (the VM's PCI BAR), "
                        "not '" + part.substr(10) + "'";
                return false;
            }
        } else if (part.rfind("worker=", 0) == 0) {
            uint32_t k;
            if (!parse_u32(part.substr(7).c_str(), k) || k >= kMaxWorkers) {
                error = "--guest " + g + ": worker= wants a worker number, 0 to " +
                        std::to_string(kMaxWorkers - 1);
                return false;
            }
            worker = int(k);
        } else if (part.rfind("weight=", 0) == 0) {
            if (!parse_weight(part.substr(7), weight)) {
                error = "--guest " + g + ": weight= wants a share of its worker, 1 to " +
                        std::to_string(kMaxGuestWeight) + " (the others' default is 1)";
                return false;
            }
        } else if (part.rfind("pkeys=", 0) == 0) {
            if (!parse_pkeys(part.substr(6), table)) {
                error = "--guest " + g + ": pkeys= wants 1-16 P_Keys like 0x8001,0x0002 (partition "
                        "0x0001-0x7fff, bit 15 for full membership)";
                return false;
            }
        } else
            rest += (rest.empty() ? "" : ":") + part;
        start = end + 1;
    }
    spec = rest;
    std::string why;
    if (!acc.parse(spec, why)) {
        error = "--guest " + g + ": " + why;
        return false;
    }
    if (colon != std::string::npos) g.resize(colon);
    if (!valid_guest_name(g)) {
        error = "invalid guest name '" + g + "' (1-32 characters of A-Z a-z 0-9 _ . -)";
        return false;
    }
    for (auto& e : o.guests)
        if (e == g) {
            error = "guest '" + g + "' given twice";
            return false;
        }
    for (size_t k = 0; k < o.addresses.size(); ++k)
        for (const cm::IpAddress& a : addrs)
            if (std::find(o.addresses[k].begin(), o.addresses[k].end(), a) != o.addresses[k].end()) {
                error = "--guest " + g + ": ip " + a.str() + " is guest " + o.guests[k] + "'s already";
                return false;
            }
    o.guests.push_back(g);
    o.access.push_back(acc);
    o.controlled_qkeys.push_back(qkeys);
    o.pkeys.push_back(table);
    o.worker_of.push_back(worker);
    o.weights.push_back(weight);
    o.addresses.push_back(addrs);
    o.vm_memory.push_back(vm_memory);
    return true;
}

GuestSettings guest_settings(const Options& o, size_t i) {
    GuestSettings s;
    s.name = o.guests[i];
    if (i < o.access.size()) s.access = o.access[i];
    s.controlled_qkeys = i < o.controlled_qkeys.size() && o.controlled_qkeys[i];
    if (i < o.pkeys.size()) s.pkeys = o.pkeys[i];
    if (i < o.weights.size()) s.weight = o.weights[i];
    if (i < o.vm_memory.size()) s.vm_memory = o.vm_memory[i];
    return s;
}

uint32_t worker_of_guest(const Options& o, size_t i) {
    if (i < o.worker_of.size() && o.worker_of[i] >= 0) return uint32_t(o.worker_of[i]);
    return o.workers ? uint32_t(i % o.workers) : 0;
}

namespace {

// The options in argv[1..argc), the config file's merged in already.
bool parse_arg_list(int argc, char** argv, Options& o, std::string& error) {
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        std::string val;
        bool has_eq = false;
        if (a.rfind("--", 0) == 0) {
            auto eq = a.find('=');
            if (eq != std::string::npos) {
                val = a.substr(eq + 1);
                a = a.substr(0, eq);
                has_eq = true;
            }
        }
        auto need_value = [&](std::string& v) {
            if (has_eq) {
                v = val;
                return true;
            }
            if (i + 1 >= argc) {
                error = "option " + a + " needs a value";
                return false;
            }
            v = argv[++i];
            return true;
        };
        if (a == "--help" || a == "-h") {
            o.help = true;
            return true;
        } else if (a == "--run-dir") {
            if (!need_value(o.run_dir)) return false;
            if (o.run_dir.empty()) {
                error = "--run-dir must not be empty";
                return false;
            }
        } else if (a == "--guest") {
            std::string g;
            if (!need_value(g)) return false;
            if (!parse_guest_arg(g, o, error)) return false;
        } else if (a == "--worker-cpus") {
            std::string v;
            if (!need_value(v)) return false;
            if (!parse_cpu_list(v, o.worker_cpus)) {
                error = "--worker-cpus wants CPU numbers and ranges such as 0,1 or 2-5 (at most " +
                        std::to_string(kMaxWorkers) + " CPUs, none twice), not '" + v + "'";
                return false;
            }
        } else if (a == "--workers") {
            std::string v;
            if (!need_value(v)) return false;
            if (!parse_u32(v.c_str(), o.workers) || o.workers == 0 || o.workers > kMaxWorkers) {
                error = "--workers must be 1.." + std::to_string(kMaxWorkers) + ", not '" + v + "'";
                return false;
            }
        } else if (a == "--lid-base") {
            std::string v;
            if (!need_value(v)) return false;
            if (!parse_u32(v.c_str(), o.lid_base) || o.lid_base == 0 || o.lid_base >= 0xc000) {
                error = "--lid-base must be a LID in 1..0xbfff, not '" + v + "'";
                return false;
            }
        } else if (a == "--idle-yield") {
            std::string v;
            if (!need_value(v)) return false;
            if (v != "auto" && v != "always") {
                error = "--idle-yield must be auto or always, not '" + v + "'";
                return false;
            }
            o.idle_yield_always = v == "always";
        } else if (a == "--attach-timeout") {
            std::string v;
            if (!need_value(v)) return false;
            if (!parse_u32(v.c_str(), o.attach_timeout_s) || o.attach_timeout_s == 0 || o.attach_timeout_s > 3600) {
                error = "--attach-timeout must be 1..3600 seconds, not '" + v + "'";
                return false;
            }
        } else if (a == "--rkey-guess-limit") {
            std::string v;
            if (!need_value(v)) return false;
            if (!parse_u32(v.c_str(), o.rkey_guess_limit) || o.rkey_guess_limit > 1000000) {
                error = "--rkey-guess-limit must be 0..1000000 errors a second, not '" + v + "'";
                return false;
            }
        } else if (a == "--qkey-guess-limit") {
            std::string v;
            if (!need_value(v)) return false;
            if (!parse_u32(v.c_str(), o.qkey_guess_limit) || o.qkey_guess_limit > 1000000) {
                error = "--qkey-guess-limit must be 0..1000000 datagrams a second, not '" + v + "'";
                return false;
            }
        } else if (a == "--lid-count") {
            std::string v;
            if (!need_value(v)) return false;
            if (!parse_u32(v.c_str(), o.lid_count) || o.lid_count == 0 || o.lid_count >= 0xc000) {
                error = "--lid-count must be 1..0xbfff, not '" + v + "'";
                return false;
            }
        } else if (a == "--metrics-listen") {
            if (!need_value(o.metrics_listen)) return false;
            sockaddr_in unused;
            if (!parse_endpoint(o.metrics_listen, unused, error)) {
                error = "--metrics-listen: " + error;
                return false;
            }
        } else if (const TransportOption* t = find_transport_option(a)) {
            std::vector<std::string>& values = o.transport_args[t->name];
            std::string v;
            if (!t->value) {
                if (has_eq) {
                    error = "option " + a + " takes no value";
                    return false;
                }
            } else if (!need_value(v)) {
                return false;
            }
            if (!t->repeatable) values.clear();
            values.push_back(v);
        } else if (a == "--quota") {
            std::string v;
            if (!need_value(v)) return false;
            if (!set_quota(o.quotas, v, error)) return false;
        } else if (a == "--log-level") {
            std::string v;
            if (!need_value(v)) return false;
            if (v == "error") o.log_level = LogLevel::Error;
            else if (v == "warn" || v == "warning") o.log_level = LogLevel::Warn;
            else if (v == "info") o.log_level = LogLevel::Info;
            else if (v == "debug") o.log_level = LogLevel::Debug;
            else {
                error = "--log-level must be error, warn, info or debug, not '" + v + "'";
                return false;
            }
        } else {
            error = "unknown argument '" + std::string(argv[i]) + "' (see --help)";
            return false;
        }
    }
    if (o.guests.empty()) {
        error = "at least one --guest NAME is required (see --help)";
        return false;
    }
    if (o.lid_base + o.guests.size() - 1 >= 0xc000) {
        error = "--lid-base leaves no unicast LID for every guest";
        return false;
    }
    if (o.lid_count && o.lid_count < o.guests.size()) {
        error = "--lid-count " + std::to_string(o.lid_count) + " is fewer than the " +
                std::to_string(o.guests.size()) + " guests";
        return false;
    }
    if (o.lid_count && o.lid_base + o.lid_count - 1 >= 0xc000) {
        error = "--lid-base plus --lid-count goes past the unicast LIDs (0xbfff)";
        return false;
    }
    for (const TransportFactory* f : transport_factories())
        if (!f->check(o.transport_args, error)) return false;
    if (!o.workers && !o.worker_cpus.empty()) o.workers = uint32_t(o.worker_cpus.size());
    if (!o.workers) o.workers = default_workers();
    if (!o.worker_cpus.empty()) {
        if (o.worker_cpus.size() != o.workers) {
            error = "--worker-cpus names " + std::to_string(o.worker_cpus.size()) + " CPU" +
                    (o.worker_cpus.size() == 1 ? "" : "s") + " for " + std::to_string(o.workers) +
                    " worker" + (o.workers == 1 ? "" : "s") + " (one CPU per worker)";
            return false;
        }
        cpu_set_t allowed;
        CPU_ZERO(&allowed);
        if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
            for (uint32_t cpu : o.worker_cpus)
                if (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
                    error = "--worker-cpus: CPU " + std::to_string(cpu) +
                            " is not one this process may run on (see taskset -p " + std::to_string(getpid()) + ")";
                    return false;
                }
    }
    for (size_t i = 0; i < o.guests.size(); ++i)
        if (o.worker_of[i] >= 0 && uint32_t(o.worker_of[i]) >= o.workers) {
            error = "--guest " + o.guests[i] + ":worker=" + std::to_string(o.worker_of[i]) + ": the shim has " +
                    std::to_string(o.workers) + " worker" + (o.workers == 1 ? "" : "s") + " (--workers)";
            return false;
        }
    // Unix socket paths are limited to 107 bytes.
    for (auto& g : o.guests) {
        if (guest_paths(o.run_dir, g).socket.size() > 107) {
            error = "--run-dir is too long for the socket path of guest '" + g + "'";
            return false;
        }
    }
    return true;
}

}  // namespace

bool parse_args(const std::vector<std::string>& args, Options& o, std::string& error) {
    std::vector<char*> argv;
    std::string prog = "vrdma-shim";
    argv.push_back(prog.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (!parse_arg_list(int(copy.size() + 1), argv.data(), o, error)) return false;
    o.args = args;
    return true;
}

bool effective_args(const std::string& config, const std::vector<std::string>& cli, std::vector<std::string>& args,
                    std::string& error) {
    args = cli;
    if (config.empty()) return true;
    std::vector<std::string> file;
    if (!config_to_args(config, file, error)) return false;
    // The file's options alone first, so that an error names the file.
    Options alone;
    std::vector<std::string> with_guest = file;
    if (std::find(file.begin(), file.end(), "--guest") == file.end()) {
        with_guest.push_back("--guest");
        with_guest.push_back("config-check");  // the file may leave the guests to the command line
    }
    if (!parse_args(with_guest, alone, error)) {
        error = "config " + config + ": " + error;
        return false;
    }
    args = merge_args(file, cli);
    return true;
}

bool parse_options(int argc, char** argv, Options& o, std::string& error) {
    std::vector<std::string> cli;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--config" || a.rfind("--config=", 0) == 0) {
            if (a == "--config" && i + 1 >= argc) {
                error = "option --config needs a value";
                return false;
            }
            o.config_file = a == "--config" ? argv[++i] : a.substr(9);
            if (o.config_file.empty()) {
                error = "--config must not be empty";
                return false;
            }
            continue;
        }
        cli.push_back(a);
    }
    o.cli_args = cli;
    std::vector<std::string> args;
    if (!effective_args(o.config_file, cli, args, error)) return false;
    return parse_args(args, o, error);
}

}  // namespace vrdma::shim
