// Registration with libibverbs and device matching.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "context.h"
#include "rdma_core_private.h"
#include "vrdma/abi.h"

namespace vrdma::prov {
verbs_context* alloc_context(ibv_device* device, int cmd_fd, void* private_data);
verbs_context* import_context(ibv_device* device, int cmd_fd);
}

// Exported marker: lets a second copy of the provider (another file, e.g. an
// installed one next to an LD_PRELOADed build) see that one is registered.
extern "C" [[gnu::visibility("default")]] const int vrdma_provider_loaded = 1;

namespace vrdma::prov {
namespace {

// Claim devices named vrdma* ...
const verbs_match_ent kMatchTable[] = {
    {.driver_data = nullptr, .u = {.modalias = "rdma_device:*Nvrdma*"}, .vendor = 0, .device = 0,
     .kind = VRDMA_MATCH_MODALIAS},
    {},
};

// ... but only those a shim published (the socket attribute exists), so a
// foreign device that happens to be called vrdma* is never taken.
bool match_device(verbs_sysfs_dev* sysfs_dev) {
    if (!sysfs_dev->match) return false;
    std::string attr = std::string(sysfs_dev->ibdev_path) + "/" + abi::kSocketAttr;
    return ::access(attr.c_str(), R_OK) == 0;
}

verbs_device* alloc_device(verbs_sysfs_dev*) {
    return static_cast<verbs_device*>(std::calloc(1, sizeof(verbs_device)));
}

void uninit_device(verbs_device* device) { std::free(device); }

const verbs_device_ops kDeviceOps = {
    .name = "vrdma",
    .match_min_abi_version = 1,
    .match_max_abi_version = 1,
    .match_table = kMatchTable,
    .static_providers = nullptr,
    .match_device = match_device,
    .alloc_context = alloc_context,
    .import_context = import_context,
    .alloc_device = alloc_device,
    .uninit_device = uninit_device,
};

[[gnu::constructor]] void register_provider() {
    const void* first = ::dlsym(RTLD_DEFAULT, "vrdma_provider_loaded");
    if (first && first != &vrdma_provider_loaded) return;  // another copy registered
    verbs_register_driver_34(&kDeviceOps);
}

}  // namespace
}  // namespace vrdma::prov
