// The shim's run directory: checked (nobody but root and the shim's user
// can change it or its ancestors), held open as a directory fd that every
// file operation of the shim starts from, exclusively owned (a locked
// shim.pid), with the ready marker (docs/reliability.md "The host's files").
#pragma once

#include <string>

#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

class RunDir {
public:
    // Resolves DIR, refuses it if another user owns or can write it or an
    // ancestor (a sticky ancestor such as /tmp excepted), creates what is
    // missing (0755), and locks DIR/shim.pid. Fails if another live shim
    // holds it; a stale file is taken over.
    bool acquire(const std::string& dir, std::string& error);
    const std::string& path() const { return dir_; }  // absolute, resolved
    int fd() const { return fd_.get(); }               // O_DIRECTORY, for *at calls
    bool mark_ready(std::string& error);
    // Removes ready and shim.pid and drops the lock.
    void release();
    ~RunDir() { release(); }

private:
    std::string dir_;
    UniqueFd fd_;
    UniqueFd pid_fd_;
};

}  // namespace vrdma::shim
