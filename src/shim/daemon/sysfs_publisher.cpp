#include "sysfs_publisher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "vrdma/abi.h"
#include "vrdma_common/fs_at.h"
#include "vrdma_common/guest_paths.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {

std::string uverbs_name(const std::string& run_dir, const std::string& guest) {
    // /dev/infiniband is shared by every shim on the host: the run
    // directory's hash keeps two shims that both serve a guest "a" apart.
    uint32_t h = 2166136261u;  // FNV-1a
    for (unsigned char c : run_dir) h = (h ^ c) * 16777619u;
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "_%08x", h);
    return "uverbs_vrdma_" + guest + suffix;
}

bool GuestPublication::publish(int run_fd, const std::string& run_dir, const std::string& dev_dir,
                               const GuestIdentity& id, std::string& error, bool in_vm) {
    GuestPaths p = guest_paths(run_dir, id.name);
    run_fd_.reset(::fcntl(run_fd, F_DUPFD_CLOEXEC, 0));
    if (!run_fd_) {
        error = std::string("cannot use the run directory's fd: ") + std::strerror(errno);
        return false;
    }
    std::string stale;
    if (!fs::remove_tree(run_fd_.get(), id.name, &stale)) {
        error = "cannot remove the stale " + p.dir + ": " + stale;
        return false;
    }
    name_ = id.name;
    if (::mkdirat(run_fd_.get(), id.name.c_str(), 0755) != 0) {
        error = "cannot create " + p.dir + ": " + std::strerror(errno);
        return false;
    }
    guest_fd_ = fs::open_dir(run_fd_.get(), id.name);
    // mkdir's mode is cut by the umask: the tree is readable by all, as sysfs.
    if (!guest_fd_ || ::fchmod(guest_fd_.get(), 0755) != 0) {
        error = "cannot open " + p.dir + ": " + std::strerror(errno);
        return false;
    }
    const std::string uv = uverbs_name(run_dir, id.name);
    const std::string verbs = "sys/class/infiniband_verbs";
    const std::string dev = "sys/class/infiniband/vrdma0";
    const std::string port = dev + "/ports/1";
    port_dir_ = p.dir + "/" + port;

    // Each file: (directory relative to RUN_DIR/NAME, name, content).
    struct File {
        std::string dir, name, content;
    };
    const abi::PortAttr pa = make_port_attr(id);
    char buf[64];
    std::vector<File> files = {
        {verbs, "abi_version", "6"},
        // librdmacm reads the UCMA ABI here (the provider emulates the device).
        {"sys/class/misc/rdma_cm", "abi_version", "4"},
        {verbs + "/" + uv, "ibdev", abi::kDeviceName},
        {verbs + "/" + uv, "abi_version", "1"},
        {verbs + "/" + uv, "dev", "1:3"},
        {dev, "node_type", "1: CA"},
        {dev, "node_guid", format_guid(id.guid)},
        {dev, "sys_image_guid", format_guid(id.guid)},
        {dev, "fw_ver", kFwVersion},
        {dev, "hw_rev", std::to_string(kHwVersion)},
        {dev, "hca_type", "vrdma"},
        {dev, "board_id", "vrdma"},
        {dev, "node_desc", "vrdma " + id.name},
        {dev, abi::kSocketAttr, p.socket},
        {port, "state", id.port_active ? "4: ACTIVE" : "1: DOWN"},
        {port, "phys_state", id.port_active ? "5: LinkUp" : "3: Disabled"},
        {port, "lid_mask_count", "0"},
        {port, "sm_lid", "0x1"},
        {port, "sm_sl", "0"},
        {port, "rate", "100 Gb/sec (4X EDR)"},
        {port, "link_layer", "InfiniBand"},
        {port + "/gids", "0", format_gid(pa.gid)},
        {port + "/gid_attrs/types", "0", "IB/RoCE v1"},
    };
    if (in_vm) files.push_back({dev, abi::kVmAttr, "1"});
    for (uint32_t i = 1; i < kGidTableLen; ++i) {  // the empty entries
        files.push_back({port + "/gids", std::to_string(i), "0000:0000:0000:0000:0000:0000:0000:0000"});
        files.push_back({port + "/gid_attrs/types", std::to_string(i), "IB/RoCE v1"});
    }
    for (size_t i = 0; i < id.pkeys.size(); ++i) {
        std::snprintf(buf, sizeof(buf), "0x%04x", id.pkeys[i]);
        files.push_back({port + "/pkeys", std::to_string(i), buf});
    }
    std::snprintf(buf, sizeof(buf), "0x%x", id.lid);
    files.push_back({port, "lid", buf});
    std::snprintf(buf, sizeof(buf), "0x%08x", pa.port_cap_flags);
    files.push_back({port, "cap_mask", buf});
    files.push_back({port + "/pkeys", "", ""});  // the directory, even with no P_Keys
    for (const File& f : files) {
        UniqueFd d = fs::walk(guest_fd_.get(), p.dir, f.dir, true, 0755, error);
        if (!d) return false;
        if (!f.name.empty() &&
            !fs::write_file(d.get(), p.dir + "/" + f.dir, f.name, f.content + "\n", 0644, error))
            return false;
    }
    port_fd_ = fs::walk(guest_fd_.get(), p.dir, port, false, 0, error);
    if (!port_fd_) return false;

    // The character device node libibverbs opens: a link to /dev/null.
    dev_fd_ = fs::open_absolute(dev_dir, true, 0755, error);
    if (!dev_fd_) return false;
    const std::string link = dev_dir + "/" + uv;
    struct stat st;
    if (::fstatat(dev_fd_.get(), uv.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        char target[PATH_MAX] = {};
        ssize_t n = S_ISLNK(st.st_mode) ? ::readlinkat(dev_fd_.get(), uv.c_str(), target, sizeof(target) - 1) : -1;
        if (n < 0 || std::string(target, size_t(n)) != "/dev/null") {
            error = link + " exists and is not a link to /dev/null: refusing to replace it";
            return false;
        }
        ::unlinkat(dev_fd_.get(), uv.c_str(), 0);
    }
    if (::symlinkat("/dev/null", dev_fd_.get(), uv.c_str()) != 0) {
        error = "cannot create " + link + ": " + strerror(errno);
        return false;
    }
    dev_link_ = uv;
    return true;
}

bool GuestPublication::set_port_state(bool active, std::string& error) {
    if (!port_fd_) return true;
    return fs::write_file(port_fd_.get(), port_dir_, "state", active ? "4: ACTIVE\n" : "1: DOWN\n", 0644, error) &&
           fs::write_file(port_fd_.get(), port_dir_, "phys_state", active ? "5: LinkUp\n" : "3: Disabled\n", 0644,
                          error);
}

void GuestPublication::unpublish() {
    if (dev_fd_ && !dev_link_.empty()) ::unlinkat(dev_fd_.get(), dev_link_.c_str(), 0);
    if (run_fd_ && !name_.empty()) {
        std::string error;
        if (!fs::remove_tree(run_fd_.get(), name_, &error)) LOG_WARN("unpublishing guest %s: %s", name_.c_str(), error.c_str());
    }
    dev_link_.clear();
    name_.clear();
    port_dir_.clear();
    port_fd_.reset();
    guest_fd_.reset();
    dev_fd_.reset();
    run_fd_.reset();
}

}  // namespace vrdma::shim
