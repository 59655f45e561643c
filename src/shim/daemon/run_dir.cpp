#include "run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "vrdma_common/fs_at.h"
#include "vrdma_common/trusted_dir.h"

namespace vrdma::shim {
namespace {

// DIR with its existing part resolved (links followed once, here, and the
// result checked): "/run/vrdma" for "/var/run/vrdma" when /var/run -> /run.
// `missing` gets the components still to be created.
bool resolve_existing(const std::string& dir, std::string& existing, std::string& missing, std::string& error) {
    std::string head = dir;
    missing.clear();
    char real[PATH_MAX];
    while (!::realpath(head.c_str(), real)) {
        if (errno != ENOENT) {
            error = "cannot resolve " + head + ": " + std::strerror(errno);
            return false;
        }
        size_t slash = head.find_last_of('/');
        if (slash == std::string::npos) {
            error = "cannot resolve " + dir;
            return false;
        }
        const std::string last = head.substr(slash + 1);
        if (last == "." || last == "..") {
            error = "run directory " + dir + ": '.' and '..' are not allowed in its missing part";
            return false;
        }
        if (!last.empty()) missing = missing.empty() ? last : last + "/" + missing;
        head = slash == 0 ? "/" : head.substr(0, slash);
    }
    existing = real;
    return true;
}

}  // namespace

bool RunDir::acquire(const std::string& dir, std::string& error) {
    if (dir.empty() || dir[0] != '/') {
        error = "run directory " + dir + " is not an absolute path";
        return false;
    }
    std::string existing, missing;
    if (!resolve_existing(dir, existing, missing, error)) return false;
    const uid_t me = ::geteuid();
    // What exists already: its ancestors may be sticky (as /tmp), the run
    // directory itself may not (when nothing is missing).
    if (!open_trusted_dir(existing, me, missing.empty() ? 1 : 0, error)) {
        error = "refusing run directory " + dir + ": " + error;
        return false;
    }
    const std::string real = missing.empty() ? existing : (existing == "/" ? "" : existing) + "/" + missing;
    UniqueFd fd = fs::open_absolute(real, true, 0755, error);
    if (!fd) return false;
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) {
        error = "cannot stat " + real + ": " + std::strerror(errno);
        return false;
    }
    if (st.st_uid != me) {
        error = "refusing run directory " + real + ": it belongs to " + describe_uid(st.st_uid) +
                ", not to the shim's user " + describe_uid(me) + " (remove it, or choose another --run-dir)";
        return false;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        char mode[8];
        std::snprintf(mode, sizeof(mode), "%04o", unsigned(st.st_mode & 07777));
        error = "refusing run directory " + real + ": mode " + mode +
                " lets other users write in it (chmod go-w it, or choose another --run-dir)";
        return false;
    }
    // Again, whole, now that it exists: a component created meanwhile by
    // someone else (under a sticky /tmp) fails here.
    error.clear();
    UniqueFd checked = open_trusted_dir(real, me, 1, error);
    struct stat cst;
    if (!checked || ::fstat(checked.get(), &cst) != 0 || cst.st_dev != st.st_dev || cst.st_ino != st.st_ino) {
        error = "refusing run directory " + real + ": " + (error.empty() ? "it changed while it was opened" : error);
        return false;
    }
    UniqueFd pid(::openat(fd.get(), "shim.pid", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
    if (!pid) {
        error = "cannot open " + real + "/shim.pid: " + std::strerror(errno);
        return false;
    }
    if (::flock(pid.get(), LOCK_EX | LOCK_NB) != 0) {
        char buf[32] = {};
        ssize_t n = ::pread(pid.get(), buf, sizeof(buf) - 1, 0);
        std::string other = n > 0 ? std::string(buf, strcspn(buf, "\n")) : "?";
        error = "run directory " + real + " is already served by a live vrdma-shim (pid " + other + ")";
        return false;
    }
    std::string text = std::to_string(::getpid()) + "\n";
    if (::ftruncate(pid.get(), 0) != 0 || ::pwrite(pid.get(), text.data(), text.size(), 0) != ssize_t(text.size())) {
        error = "cannot write " + real + "/shim.pid: " + std::strerror(errno);
        return false;
    }
    dir_ = real;
    fd_ = std::move(fd);
    pid_fd_ = std::move(pid);
    ::unlinkat(fd_.get(), "ready", 0);  // stale marker of a dead shim
    return true;
}

bool RunDir::mark_ready(std::string& error) {
    return fs::write_file(fd_.get(), dir_, "ready", std::to_string(::getpid()) + "\n", 0644, error);
}

void RunDir::release() {
    if (!pid_fd_) return;
    ::unlinkat(fd_.get(), "ready", 0);
    ::unlinkat(fd_.get(), "shim.pid", 0);
    pid_fd_.reset();
    fd_.reset();
}

}  // namespace vrdma::shim
