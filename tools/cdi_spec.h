// A Container Device Interface spec for guests of a shim (vrdma-run --cdi):
// what a container runtime (podman, containerd, CRI-O, a Kubernetes device
// plugin) must add to a container so that its programs use a guest's vrdma0
// exactly as vrdma-run would give it to them.
#pragma once

#include <string>
#include <vector>

#include "provider_path.h"

namespace vrdma::tools {

struct CdiGuest {
    std::string name;         // the CDI device's name: the guest's
    std::string dir;          // RUN_DIR/NAME (the device tree and the socket)
    std::string uverbs_node;  // /dev/infiniband/uverbs_vrdma_NAME_HASH
    std::vector<std::pair<std::string, std::string>> env;  // as vrdma-run sets it
};

// The spec (JSON, CDI 0.5.0: what Debian 12's podman 4.3 reads; nothing newer
// is used; kind vrdma.dev/guest): one device per guest,
// each with its environment, its directory mounted read-only at the same
// path, the provider library mounted read-only at the same path, and the
// uverbs node libibverbs opens (a character device 1:3, as on the host).
std::string cdi_spec(const std::vector<CdiGuest>& guests, const std::string& provider);

// The spec of `guests` of the shim in `run_dir` on stdout: 0, or 3 with the
// reason (prefixed with `tool`) when a guest's tree is not as a shim
// publishes it.
int print_cdi_spec(const std::string& run_dir, const std::vector<std::string>& guests, const Provider& provider,
                   const char* tool);

}  // namespace vrdma::tools
