// Importing a context (ibv_import_device) and what it shares by handle
// (ibv_import_pd, ibv_import_mr, ibv_import_dm): import.cpp.
#pragma once

#include <cstdint>

namespace vrdma::prov {

struct Context;

// What ibv_import_device hands alloc_context through verbs_open_device's
// private_data: the state to share (one user already counted for the new
// context), the async fd the new context reads and the command fd it
// takes. `taken`: alloc_context made the context, which owns all three.
struct ImportRequest {
    static constexpr uint64_t kMagic = 0x76726d61696d7074;  // "vrmaimpt"
    uint64_t magic = kMagic;
    Context* ctx = nullptr;
    int async_fd = -1;
    int cmd_fd = -1;
    bool taken = false;
};

}  // namespace vrdma::prov
