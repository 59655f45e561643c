#include "shared_object.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace vrdma::prov {
namespace {

bool is_object_of(int fd, const MapEntry& e) {
    struct stat st;
    return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == e.inode &&
           major(st.st_dev) == e.dev_major && minor(st.st_dev) == e.dev_minor;
}

// A descriptor of this process on the same file, reopened read-write
// through /proc/self/fd (which works for memfds and unlinked files).
UniqueFd from_open_descriptors(const MapEntry& e) {
    DIR* d = ::opendir("/proc/self/fd");
    if (!d) return UniqueFd();
    UniqueFd found;
    const int self = ::dirfd(d);
    while (dirent* ent = ::readdir(d)) {
        char* end = nullptr;
        long n = std::strtol(ent->d_name, &end, 10);
        if (end == ent->d_name || *end || n == self || !is_object_of(int(n), e)) continue;
        char path[64];
        std::snprintf(path, sizeof(path), "/proc/self/fd/%ld", n);
        found.reset(::open(path, O_RDWR | O_CLOEXEC));
        if (found) break;
    }
    ::closedir(d);
    return found;
}

}  // namespace

int open_mapped_object(const MapEntry& e, UniqueFd& out, std::string& why) {
    char path[96];
    std::snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", (unsigned long)e.start,
                  (unsigned long)e.end);
    UniqueFd fd(::open(path, O_RDWR | O_CLOEXEC));
    int map_files_err = fd ? 0 : errno;
    if (fd && !is_object_of(fd.get(), e)) fd.reset();
    if (!fd) fd = from_open_descriptors(e);
    if (!fd && !e.path.empty() && e.path[0] == '/') {
        fd.reset(::open(e.path.c_str(), O_RDWR | O_CLOEXEC));
        if (fd && !is_object_of(fd.get(), e)) fd.reset();
    }
    if (!fd) {
        why = map_files_err == EPERM || map_files_err == EACCES
                  ? "its file is neither open nor reachable by name, and /proc/self/map_files needs "
                    "CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE"
                  : "its file cannot be opened read-write";
        return map_files_err == EACCES ? EACCES : EPERM;
    }
    out = std::move(fd);
    return 0;
}

}  // namespace vrdma::prov
