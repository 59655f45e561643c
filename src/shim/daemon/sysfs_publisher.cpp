#include "sysfs_publisher.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "run_dir.h"
#include "vrdma/abi.h"
#include "vrdma_common/guest_paths.h"

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

bool GuestPublication::publish(const std::string& run_dir, const std::string& dev_dir, const GuestIdentity& id,
                               std::string& error) {
    GuestPaths p = guest_paths(run_dir, id.name);
    remove_tree(p.dir);
    guest_dir_ = p.dir;
    const std::string uv = uverbs_name(run_dir, id.name);
    const std::string verbs = p.sysfs + "/class/infiniband_verbs";
    const std::string dev = p.device_dir;
    const std::string port = dev + "/ports/1";
    port_dir_ = port;
    for (const std::string& d : {verbs + "/" + uv, port + "/gids", port + "/gid_attrs/types", port + "/pkeys"})
        if (!mkdir_p(d, 0755, error)) return false;

    const abi::PortAttr pa = make_port_attr(id);
    char buf[64];
    std::vector<std::pair<std::string, std::string>> files = {
        {verbs + "/abi_version", "6"},
        {verbs + "/" + uv + "/ibdev", abi::kDeviceName},
        {verbs + "/" + uv + "/abi_version", "1"},
        {verbs + "/" + uv + "/dev", "1:3"},
        {dev + "/node_type", "1: CA"},
        {dev + "/node_guid", format_guid(id.guid)},
        {dev + "/sys_image_guid", format_guid(id.guid)},
        {dev + "/fw_ver", kFwVersion},
        {dev + "/hw_rev", std::to_string(kHwVersion)},
        {dev + "/hca_type", "vrdma"},
        {dev + "/board_id", "vrdma"},
        {dev + "/node_desc", "vrdma " + id.name},
        {dev + "/" + abi::kSocketAttr, p.socket},
        {port + "/state", id.port_active ? "4: ACTIVE" : "1: DOWN"},
        {port + "/phys_state", id.port_active ? "5: LinkUp" : "3: Disabled"},
        {port + "/lid_mask_count", "0"},
        {port + "/sm_lid", "0x1"},
        {port + "/sm_sl", "0"},
        {port + "/rate", "100 Gb/sec (4X EDR)"},
        {port + "/link_layer", "InfiniBand"},
        {port + "/gids/0", format_gid(pa.gid)},
        {port + "/gid_attrs/types/0", "IB/RoCE v1"},
    };
    for (size_t i = 0; i < id.pkeys.size(); ++i) {
        std::snprintf(buf, sizeof(buf), "0x%04x", id.pkeys[i]);
        files.emplace_back(port + "/pkeys/" + std::to_string(i), buf);
    }
    std::snprintf(buf, sizeof(buf), "0x%x", id.lid);
    files.emplace_back(port + "/lid", buf);
    std::snprintf(buf, sizeof(buf), "0x%08x", pa.port_cap_flags);
    files.emplace_back(port + "/cap_mask", buf);
    for (auto& [path, content] : files)
        if (!write_file(path, content + "\n", error)) return false;

    // The character device node libibverbs opens: a link to /dev/null.
    if (!mkdir_p(dev_dir, 0755, error)) return false;
    const std::string link = dev_dir + "/" + uv;
    struct stat st;
    if (::lstat(link.c_str(), &st) == 0) {
        char target[PATH_MAX] = {};
        ssize_t n = S_ISLNK(st.st_mode) ? ::readlink(link.c_str(), target, sizeof(target) - 1) : -1;
        if (n < 0 || std::string(target, size_t(n)) != "/dev/null") {
            error = link + " exists and is not a link to /dev/null: refusing to replace it";
            return false;
        }
        ::unlink(link.c_str());
    }
    if (::symlink("/dev/null", link.c_str()) != 0) {
        error = "cannot create " + link + ": " + strerror(errno);
        return false;
    }
    dev_link_ = link;
    return true;
}

bool GuestPublication::set_port_state(bool active, std::string& error) {
    if (port_dir_.empty()) return true;
    return write_file(port_dir_ + "/state", active ? "4: ACTIVE\n" : "1: DOWN\n", error) &&
           write_file(port_dir_ + "/phys_state", active ? "5: LinkUp\n" : "3: Disabled\n", error);
}

void GuestPublication::unpublish() {
    if (!dev_link_.empty()) ::unlink(dev_link_.c_str());
    if (!guest_dir_.empty()) remove_tree(guest_dir_);
    dev_link_.clear();
    guest_dir_.clear();
    port_dir_.clear();
}

}  // namespace vrdma::shim
