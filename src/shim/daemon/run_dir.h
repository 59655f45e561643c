// The shim's run directory: exclusive ownership (a locked DIR/shim.pid), the
// DIR/ready marker, and small filesystem helpers.
#pragma once

#include <sys/types.h>

#include <string>

#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

bool mkdir_p(const std::string& path, mode_t mode, std::string& error);
bool write_file(const std::string& path, const std::string& content, std::string& error);
// rm -rf (does not follow symlinks).
void remove_tree(const std::string& path);

class RunDir {
public:
    // Creates DIR if needed and locks DIR/shim.pid. Fails if another live
    // shim holds it; a stale file is taken over.
    bool acquire(const std::string& dir, std::string& error);
    const std::string& path() const { return dir_; }  // absolute
    bool mark_ready(std::string& error);
    // Removes ready and shim.pid and drops the lock.
    void release();
    ~RunDir() { release(); }

private:
    std::string dir_;
    UniqueFd pid_fd_;
};

}  // namespace vrdma::shim
