// Memory the process maps MAP_SHARED (a /dev/shm or tmpfs file, even
// unlinked and closed; memfd; SysV shared memory; MAP_SHARED|MAP_ANONYMOUS
// memory shared with a forked child) is registered by giving the shim the
// same object: it maps the file itself, so what other processes store is
// seen by the shim and the other way round (docs/protocol.md "Guest
// memory").
#pragma once

#include <string>

#include "proc_maps.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::prov {

// Opens, read-write, the object that backs the shared mapping `e`: through
// /proc/self/map_files (needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), else
// a descriptor the process still holds on it, else its path if it still
// names the same file. 0 or a positive errno, with a reason in `why`.
int open_mapped_object(const MapEntry& e, UniqueFd& out, std::string& why);

}  // namespace vrdma::prov
