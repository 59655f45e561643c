// vrdma-vm-agent: the VM's half of a VM guest (docs/protocol.md "VM
// tenants"). Runs as root inside the VM, whose stock kernel needs no vrdma
// module: finds the vrdma VM device (vm_device.h), publishes the guest's
// device under the run directory exactly as a host shim does (so that
// vrdma-run and libibverbs in the VM find vrdma0 the same way), and serves
// the guest's socket there. Each process that opens vrdma0 connects to it;
// the agent asks the shim, through the device's mailbox (vm_abi.h), for a
// region of the device's memory for the process's arena and hands the
// process the device's BARs to map it, then attaches its context. A
// process's closing the device (its socket closes) detaches its context;
// the regions its pages moved onto stay its own until it exits (they are
// its heap and stack now), when the agent closes them too.
//
// The agent holds the write end of each process's async event pipe, as a
// host shim does. When the device goes (the shim stopped serving it, or
// stopped answering the agent's pings: a shim killed with SIGKILL writes
// nothing into the device page) the agent exits, and each process reads
// end of file there: IBV_EVENT_DEVICE_FATAL.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "attach.h"
#include "guest_access.h"
#include "run_dir.h"
#include "sysfs_publisher.h"
#include "vm_device.h"
#include "vrdma/abi.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/guest_paths.h"
#include "vrdma_common/log.h"
#include "vrdma_common/vm_mailbox.h"

namespace vrdma::vm {
namespace {

const char* const kHelp = R"(NAME
    vrdma-vm-agent - serve a VM guest's vrdma0 to the processes of this VM

SYNOPSIS
    vrdma-vm-agent [--run-dir DIR] [--device PCI_ADDRESS] [--owner USER]
                   [--group GROUP] [--shim-timeout SECONDS]
                   [--log-level error|warn|info|debug]
    vrdma-vm-agent --help

DESCRIPTION
    Inside a QEMU VM that the host's vrdma-shim serves as a VM guest
    (vrdma-shim --guest NAME:vm, QEMU with -device ivshmem-doorbell on the
    guest's ivshmem.sock), the agent makes the guest's device usable by
    the VM's processes with the VM's own kernel: no vrdma module, no kernel
    RDMA. It finds the device, publishes the guest's device tree under the
    run directory as a host shim does, and serves the guest's socket:
        vrdma-run --run-dir DIR --guest NAME -- ibv_devinfo
    then works inside the VM as it does on the host.

    The agent runs as root: it opens the device's BARs (its sysfs resource
    files) and hands them to the processes it serves, which map their own
    part of the device's memory. A process allowed on the socket can map
    all of it: the processes of one VM guest are one tenant.

    When the device goes, the agent exits, and every process using vrdma0
    gets IBV_EVENT_DEVICE_FATAL from ibv_get_async_event, and EIO from
    the verbs after it, as on a host whose shim stopped. The device goes
    when the shim stops serving it, and when the shim does not answer for
    --shim-timeout seconds: the agent asks it something at least once a
    second, so that a shim killed without a word is noticed too. The agent
    does not outlive its shim: QEMU does not connect to a new one, so a VM
    needs a restart (or its device hot-plugged again) after the shim's.

OPTIONS
    --run-dir DIR
        Where the guest's tree and socket go (default /run/vrdma).
    --device PCI_ADDRESS
        The device, as in /sys/bus/pci/devices (default: the first ivshmem
        device whose memory holds a vrdma device page).
    --owner USER, --group GROUP
        Who may use the device besides root: the socket's owner and group
        (default: root only).
    --shim-timeout SECONDS
        How long the shim may take to answer before the device is taken to
        be gone (default 5, from 1 to 3600).
    --log-level LEVEL
        error, warn, info (default) or debug; logs go to standard error.

EXIT STATUS
    0 after SIGTERM or SIGINT; 1 when the device is missing or goes away
    (the shim stopped, QEMU's device was reset); 2 on wrong usage.
)";

struct Client {
    UniqueFd sock;
    pid_t pid = 0;
    uint64_t owner = 0;
    uint64_t arena_offset = 0, arena_len = 0;  // after VmOpen
    bool attached = false;
    std::map<uint32_t, uint64_t> segments;  // by id: the region each lies in
    // The write end of the process's async event pipe (sent with Attach):
    // closed when the device goes, which the process reads as
    // IBV_EVENT_DEVICE_FATAL, or when the process closes the device.
    UniqueFd async_w;
};

class Agent {
public:
    bool start(const std::string& run_dir, const std::string& pci, const std::string& access_spec,
               int shim_timeout_s, std::string& error);
    int run();

private:
    void accept_all();
    // False: the connection is to be closed.
    bool on_message(Client& c);
    void close_client(uint64_t owner);
    int mailbox(const abi::VmRequest& q, abi::VmReply& r);
    void reply(Client& c, int status, const char* message, uint32_t lid = 0, uint32_t arg = 0,
               std::span<const int> fds = {});

    VmDevice dev_;
    std::unique_ptr<VmMailboxClient> mb_;
    shim::RunDir run_dir_;
    shim::GuestPublication pub_;
    shim::GuestAccess access_;
    UniqueFd listener_, signals_;
    std::map<uint64_t, Client> clients_;  // by owner
    // Processes that closed the device and may still map regions: a pidfd
    // each, and the owners to close when it exits.
    struct Exiting {
        UniqueFd pidfd;
        std::vector<uint64_t> owners;
    };
    std::map<pid_t, Exiting> exiting_;
    void close_owner(uint64_t owner);
    // Asks the shim for nothing when nothing was asked for a second.
    void ping_if_quiet();
    uint64_t next_owner_ = 1;
    bool device_gone_ = false;
    int shim_timeout_ms_ = 5000;
    std::chrono::steady_clock::time_point last_answer_ = std::chrono::steady_clock::now();
};

bool Agent::start(const std::string& run_dir, const std::string& pci, const std::string& access_spec,
                  int shim_timeout_s, std::string& error) {
    shim_timeout_ms_ = shim_timeout_s * 1000;
    if (!access_.parse(access_spec, error)) return false;
    if (!open_vm_device(pci, dev_, error)) return false;
    mb_ = std::make_unique<VmMailboxClient>(dev_.mem, [this] { dev_.ring(); });
    const abi::VmDevicePage& p = dev_.page();
    shim::GuestIdentity id;
    id.name.assign(p.guest_name, strnlen(p.guest_name, sizeof(p.guest_name)));
    id.lid = p.lid;
    id.guid = p.guid;
    if (!valid_guest_name(id.name)) {
        error = "the device page names no valid guest";
        return false;
    }
    if (!run_dir_.acquire(run_dir, error)) return false;
    if (!pub_.publish(run_dir_.fd(), run_dir_.path(), "/dev/infiniband", id, error, true)) return false;
    if (!shim::open_guest_socket(pub_.guest_dir_fd(), guest_paths(run_dir_.path(), id.name).socket, access_,
                                 listener_, error))
        return false;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    signals_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!run_dir_.mark_ready(error)) return false;
    std::printf("vrdma-vm-agent: ready: guest %s(lid %u) device %s memory %llu MiB run-dir %s\n", id.name.c_str(),
                id.lid, dev_.pci.c_str(), (unsigned long long)(p.memory_bytes >> 20), run_dir_.path().c_str());
    std::fflush(stdout);
    return true;
}

int Agent::mailbox(const abi::VmRequest& q, abi::VmReply& r) {
    const int rc = mb_->call(q, r, shim_timeout_ms_);
    if (rc == ETIMEDOUT || rc == ESHUTDOWN) {
        if (!device_gone_)
            LOG_ERR("the shim %s", rc == ESHUTDOWN ? "stopped serving this VM's device"
                                                   : "has not answered for the --shim-timeout");
        device_gone_ = true;
        std::snprintf(r.message, sizeof(r.message), "the vrdma shim is gone");
    } else {
        last_answer_ = std::chrono::steady_clock::now();
    }
    return rc;
}

void Agent::ping_if_quiet() {
    if (std::chrono::steady_clock::now() - last_answer_ < std::chrono::seconds(1)) return;
    abi::VmReply r{};
    mailbox(abi::VmRequest{abi::VmOp::Ping, 0, 0, 0, 0, 0}, r);
}

void Agent::reply(Client& c, int status, const char* message, uint32_t lid, uint32_t arg, std::span<const int> fds) {
    abi::SockReply r{};
    r.magic = abi::kMagic;
    r.status = status;
    r.guest_lid = lid;
    r.arg = arg;
    std::snprintf(r.message, sizeof(r.message), "%s", message);
    (void)send_with_fds(c.sock.get(), &r, sizeof(r), fds, MSG_DONTWAIT);
}

bool Agent::on_message(Client& c) {
    alignas(8) uint8_t buf[256];
    std::vector<UniqueFd> fds;
    long n = recv_with_fds(c.sock.get(), buf, sizeof(buf), fds);
    if (n <= 0) return false;
    abi::SockHeader h;
    if (size_t(n) < sizeof(h)) return false;
    std::memcpy(&h, buf, sizeof(h));
    if (h.magic != abi::kMagic || h.version != abi::kVersion) {
        reply(c, EPROTO, "wrong magic or ABI version (the provider and the agent differ)");
        return false;
    }
    abi::SockAttach a{};
    if (h.op == abi::SockOp::VmOpen || h.op == abi::SockOp::Attach) {
        if (size_t(n) != sizeof(a)) return false;
        std::memcpy(&a, buf, sizeof(a));
    }
    abi::SockAddSegment sg{};
    if (h.op == abi::SockOp::VmAlloc || h.op == abi::SockOp::VmFree || h.op == abi::SockOp::AddSegment) {
        if (size_t(n) != sizeof(sg)) return false;
        std::memcpy(&sg, buf, sizeof(sg));
    }
    if (h.op == abi::SockOp::RemoveSegment) {
        abi::SockRemoveSegment rs;
        if (size_t(n) != sizeof(rs)) return false;
        std::memcpy(&rs, buf, sizeof(rs));
        sg.seg_id = rs.seg_id;
    }
    const bool needs_context = h.op == abi::SockOp::AddSegment || h.op == abi::SockOp::RemoveSegment;
    if (needs_context && !c.attached) {
        reply(c, EINVAL, "not attached");
        return true;
    }
    abi::VmReply r{};
    switch (h.op) {
    case abi::SockOp::VmOpen: {
        if (c.arena_len) {
            reply(c, EBUSY, "this connection has its arena already");
            return true;
        }
        if (int rc = mailbox(abi::VmRequest{abi::VmOp::Alloc, 0, c.owner, 0, a.arena_len, 0}, r)) {
            reply(c, rc, r.message);
            return !device_gone_;
        }
        c.arena_offset = r.offset;
        c.arena_len = a.arena_len;
        const int bars[2] = {dev_.bar2.get(), dev_.bar0.get()};
        reply(c, 0, "", 0, uint32_t(r.offset / abi::kPageSize), bars);
        return true;
    }
    case abi::SockOp::Attach:
        if (!c.arena_len || c.attached || a.arena_len != c.arena_len) {
            reply(c, EINVAL, "Attach before VmOpen, twice, or with another length");
            return true;
        }
        if (int rc = mailbox(abi::VmRequest{abi::VmOp::Attach, 0, c.owner, c.arena_offset, a.arena_len, a.arena_gva}, r)) {
            reply(c, rc, r.message);
            return !device_gone_;
        }
        c.attached = true;
        if (fds.size() == 1) c.async_w = std::move(fds[0]);
        reply(c, 0, "", r.lid);
        return true;
    case abi::SockOp::VmAlloc:
        if (int rc = mailbox(abi::VmRequest{abi::VmOp::Alloc, 0, c.owner, 0, sg.len, 0}, r)) {
            reply(c, rc, r.message);
            return !device_gone_;
        }
        reply(c, 0, "", 0, uint32_t(r.offset / abi::kPageSize));
        return true;
    case abi::SockOp::VmFree:
        if (int rc = mailbox(abi::VmRequest{abi::VmOp::Free, 0, c.owner, sg.offset, 0, 0}, r)) {
            reply(c, rc, r.message);
            return !device_gone_;
        }
        reply(c, 0, "");
        return true;
    case abi::SockOp::AddSegment:
        // The fd the provider sent is the device's own memory: the offset
        // says where.
        if (int rc = mailbox(abi::VmRequest{abi::VmOp::AddSegment, sg.seg_id, c.owner, sg.offset, sg.len, sg.gva}, r)) {
            reply(c, rc, r.message);
            return !device_gone_;
        }
        c.segments[sg.seg_id] = sg.offset;
        reply(c, 0, "");
        return true;
    case abi::SockOp::RemoveSegment: {
        if (int rc = mailbox(abi::VmRequest{abi::VmOp::RemoveSegment, sg.seg_id, c.owner, 0, 0, 0}, r)) {
            reply(c, rc, r.message);
            return !device_gone_;
        }
        // Its region goes back with it.
        auto it = c.segments.find(sg.seg_id);
        if (it != c.segments.end()) {
            mailbox(abi::VmRequest{abi::VmOp::Free, 0, c.owner, it->second, 0, 0}, r);
            c.segments.erase(it);
        }
        reply(c, 0, "");
        return true;
    }
    default:
        reply(c, ENOTSUP, "not yet inside a VM (docs/protocol.md \"VM tenants\")");
        return true;
    }
}

void Agent::accept_all() {
    for (;;) {
        int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return;
        Client c;
        c.sock.reset(fd);
        ucred cred{};
        socklen_t len = sizeof(cred);
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || !access_.allows(cred.uid, cred.gid)) {
            reply(c, EACCES, "access refused");
            continue;
        }
        c.pid = cred.pid;
        c.owner = next_owner_++;
        clients_.emplace(c.owner, std::move(c));
    }
}

// The connection closed: the context detaches now, its regions go when
// the process exits (at once if it has).
void Agent::close_client(uint64_t owner) {
    auto it = clients_.find(owner);
    if (it == clients_.end()) return;
    const pid_t pid = it->second.pid;
    const bool held = it->second.arena_len != 0;
    const uint64_t arena_offset = it->second.arena_offset;
    clients_.erase(it);
    if (!held || device_gone_) return;
    abi::VmReply r{};
    mailbox(abi::VmRequest{abi::VmOp::Detach, 0, owner, 0, 0, 0}, r);
    // The arena goes back at once (the provider unmaps it as it closes);
    // the pages the process's registrations moved stay its until it exits.
    mailbox(abi::VmRequest{abi::VmOp::Free, 0, owner, arena_offset, 0, 0}, r);
    Exiting& e = exiting_[pid];
    if (!e.pidfd) e.pidfd.reset(int(::syscall(SYS_pidfd_open, pid, 0)));
    e.owners.push_back(owner);
    if (!e.pidfd) {  // gone already
        for (uint64_t o : e.owners) close_owner(o);
        exiting_.erase(pid);
    }
}

void Agent::close_owner(uint64_t owner) {
    abi::VmReply r{};
    if (!device_gone_) mailbox(abi::VmRequest{abi::VmOp::Close, 0, owner, 0, 0, 0}, r);
}

int Agent::run() {
    while (!device_gone_) {
        std::vector<pollfd> fds = {{signals_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
        std::vector<uint64_t> owners;
        for (auto& [owner, c] : clients_) {
            fds.push_back({c.sock.get(), POLLIN, 0});
            owners.push_back(owner);
        }
        std::vector<pid_t> pids;
        for (auto& [pid, e] : exiting_) {
            fds.push_back({e.pidfd.get(), POLLIN, 0});
            pids.push_back(pid);
        }
        // The device is looked at once a second, and the shim asked if
        // nothing else was: a shim that stopped, or went without a word,
        // ends the agent even with no process asking anything.
        if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) return 1;
        if (dev_.page().shim_state.load(std::memory_order_acquire) != abi::kShimRunning) {
            LOG_ERR("the shim stopped serving this VM's device");
            device_gone_ = true;
            break;
        }
        if (fds[0].revents) return 0;
        ping_if_quiet();
        if (device_gone_) break;
        if (fds[1].revents) accept_all();
        for (size_t i = 0; i < owners.size(); ++i) {
            if (!fds[2 + i].revents) continue;
            auto it = clients_.find(owners[i]);
            if (it != clients_.end() && !on_message(it->second)) close_client(owners[i]);
        }
        for (size_t i = 0; i < pids.size(); ++i) {
            if (!fds[2 + owners.size() + i].revents) continue;
            auto it = exiting_.find(pids[i]);
            if (it == exiting_.end()) continue;
            for (uint64_t o : it->second.owners) close_owner(o);
            exiting_.erase(it);
        }
    }
    // Exiting closes the processes' async pipes: IBV_EVENT_DEVICE_FATAL.
    size_t attached = 0;
    for (auto& [owner, c] : clients_) attached += c.attached;
    LOG_ERR("the device is gone: %zu process%s using it get IBV_EVENT_DEVICE_FATAL", attached,
            attached == 1 ? "" : "es");
    return 1;
}

}  // namespace
}  // namespace vrdma::vm

int main(int argc, char** argv) {
    std::string run_dir = "/run/vrdma", pci, access;
    int shim_timeout = 5;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&](const char* name) -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "vrdma-vm-agent: %s needs a value (see --help)\n", name);
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            std::fputs(vrdma::vm::kHelp, stdout);
            return 0;
        } else if (a == "--run-dir") {
            run_dir = value("--run-dir");
        } else if (a == "--device") {
            pci = value("--device");
        } else if (a == "--owner") {
            access += (access.empty() ? "" : ":") + std::string("owner=") + value("--owner");
        } else if (a == "--group") {
            access += (access.empty() ? "" : ":") + std::string("group=") + value("--group");
        } else if (a == "--shim-timeout") {
            const std::string v = value("--shim-timeout");
            char* end = nullptr;
            const long t = std::strtol(v.c_str(), &end, 10);
            if (v.empty() || *end || t < 1 || t > 3600) {
                std::fprintf(stderr, "vrdma-vm-agent: --shim-timeout must be whole seconds from 1 to 3600, not '%s'\n",
                             v.c_str());
                return 2;
            }
            shim_timeout = int(t);
        } else if (a == "--log-level") {
            const std::string l = value("--log-level");
            if (l == "error") vrdma::set_log_level(vrdma::LogLevel::Error);
            else if (l == "warn") vrdma::set_log_level(vrdma::LogLevel::Warn);
            else if (l == "info") vrdma::set_log_level(vrdma::LogLevel::Info);
            else if (l == "debug") vrdma::set_log_level(vrdma::LogLevel::Debug);
            else {
                std::fprintf(stderr, "vrdma-vm-agent: --log-level must be error, warn, info or debug\n");
                return 2;
            }
        } else {
            std::fprintf(stderr, "vrdma-vm-agent: unknown argument '%s' (see --help)\n", a.c_str());
            return 2;
        }
    }
    vrdma::set_log_prefix("vrdma-vm-agent");
    if (access.empty()) access = "owner=root";
    vrdma::vm::Agent agent;
    std::string error;
    if (!agent.start(run_dir, pci, access, shim_timeout, error)) {
        std::fprintf(stderr, "vrdma-vm-agent: %s\n", error.c_str());
        return 1;
    }
    return agent.run();
}
