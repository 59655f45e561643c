// Where the provider library is, for the tools that hand it to programs
// (vrdma-run, and the CDI spec of vrdma-run --cdi and vrdmactl cdi).
#pragma once

#include <string>

namespace vrdma::tools {

struct Provider {
    std::string library;  // the .so to preload; empty: none found
    bool from_build_tree = false;
};

// Run from the build tree: the provider built beside the tool. Installed:
// the one installed for libibverbs.
Provider find_provider();

}  // namespace vrdma::tools
