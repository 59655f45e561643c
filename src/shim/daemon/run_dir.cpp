#include "run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace vrdma::shim {

bool mkdir_p(const std::string& path, mode_t mode, std::string& error) {
    std::string cur;
    size_t pos = 0;
    while (pos <= path.size()) {
        size_t next = path.find('/', pos);
        if (next == std::string::npos) next = path.size();
        cur = path.substr(0, next);
        if (!cur.empty() && ::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) {
            error = "cannot create " + cur + ": " + strerror(errno);
            return false;
        }
        pos = next + 1;
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        error = path + " is not a directory";
        return false;
    }
    return true;
}

bool write_file(const std::string& path, const std::string& content, std::string& error) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd) {
        error = "cannot create " + path + ": " + strerror(errno);
        return false;
    }
    if (::write(fd.get(), content.data(), content.size()) != ssize_t(content.size())) {
        error = "cannot write " + path + ": " + strerror(errno);
        return false;
    }
    return true;
}

void remove_tree(const std::string& path) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        if (DIR* d = ::opendir(path.c_str())) {
            while (dirent* e = ::readdir(d)) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                remove_tree(path + "/" + e->d_name);
            }
            ::closedir(d);
        }
        ::rmdir(path.c_str());
    } else {
        ::unlink(path.c_str());
    }
}

bool RunDir::acquire(const std::string& dir, std::string& error) {
    if (!mkdir_p(dir, 0755, error)) return false;
    char real[PATH_MAX];
    if (!::realpath(dir.c_str(), real)) {
        error = "cannot resolve " + dir + ": " + strerror(errno);
        return false;
    }
    std::string pid_path = std::string(real) + "/shim.pid";
    UniqueFd fd(::open(pid_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd) {
        error = "cannot open " + pid_path + ": " + strerror(errno);
        return false;
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        char buf[32] = {};
        ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
        std::string other = n > 0 ? std::string(buf, strcspn(buf, "\n")) : "?";
        error = "run directory " + std::string(real) + " is already served by a live vrdma-shim (pid " + other + ")";
        return false;
    }
    std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
        error = "cannot write " + pid_path + ": " + strerror(errno);
        return false;
    }
    dir_ = real;
    pid_fd_ = std::move(fd);
    ::unlink((dir_ + "/ready").c_str());  // stale marker of a dead shim
    return true;
}

bool RunDir::mark_ready(std::string& error) {
    return write_file(dir_ + "/ready", std::to_string(::getpid()) + "\n", error);
}

void RunDir::release() {
    if (!pid_fd_) return;
    ::unlink((dir_ + "/ready").c_str());
    ::unlink((dir_ + "/shim.pid").c_str());
    pid_fd_.reset();
}

}  // namespace vrdma::shim
