#include "vrdma_common/fs_at.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace vrdma::fs {
namespace {

std::vector<std::string> components(const std::string& rel) {
    std::vector<std::string> parts;
    size_t pos = 0;
    while (pos < rel.size()) {
        size_t slash = rel.find('/', pos);
        if (slash == std::string::npos) slash = rel.size();
        if (slash > pos) parts.push_back(rel.substr(pos, slash - pos));
        pos = slash + 1;
    }
    return parts;
}

std::string joined(const std::string& dir, const std::string& name) {
    return dir == "/" ? "/" + name : dir + "/" + name;
}

// Entries of the directory `fd` (a dup is read, so `fd` stays usable).
bool list_entries(int fd, std::vector<std::string>& names) {
    int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return false;
    DIR* d = ::fdopendir(copy);
    if (!d) {
        ::close(copy);
        return false;
    }
    while (dirent* e = ::readdir(d)) {
        if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
        names.emplace_back(e->d_name);
    }
    ::closedir(d);
    return true;
}

bool remove_below(int dirfd, const std::string& name, int depth, std::string* error,
                  const std::function<void()>& before_step) {
    auto fail = [&](const std::string& why) {
        if (error && error->empty()) *error = why;
        return false;
    };
    if (before_step) before_step();
    UniqueFd dir = open_dir(dirfd, name);
    if (!dir) {
        // Not a directory (a file, a socket, a link, or a directory that was
        // just swapped for a link): unlink the name itself.
        if (errno != ENOTDIR && errno != ELOOP) {
            if (errno == ENOENT) return true;
            if (errno != EACCES) return fail("cannot open " + name + ": " + std::strerror(errno));
        }
        if (before_step) before_step();
        if (::unlinkat(dirfd, name.c_str(), 0) == 0 || errno == ENOENT) return true;
        // A directory again (swapped back): the next removal gets it.
        return fail("cannot remove " + name + ": " + std::strerror(errno));
    }
    if (depth >= kMaxRemoveDepth) return fail(name + " is nested deeper than " + std::to_string(kMaxRemoveDepth) +
                                              " directories: left in place");
    std::vector<std::string> names;
    if (!list_entries(dir.get(), names)) return fail("cannot read " + name + ": " + std::strerror(errno));
    bool ok = true;
    for (const std::string& n : names) ok = remove_below(dir.get(), n, depth + 1, error, before_step) && ok;
    if (before_step) before_step();
    if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return ok;
    if (errno == ENOTDIR) {  // swapped for a link after it was emptied: remove the link
        if (::unlinkat(dirfd, name.c_str(), 0) == 0) return ok;
    }
    return fail("cannot remove " + name + ": " + std::strerror(errno));
}

}  // namespace

UniqueFd open_dir(int dirfd, const std::string& name) {
    return UniqueFd(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

UniqueFd walk(int dirfd, const std::string& shown, const std::string& rel, bool create, mode_t mode,
              std::string& error) {
    UniqueFd cur(::fcntl(dirfd, F_DUPFD_CLOEXEC, 0));
    if (!cur) {
        error = "cannot use " + shown + ": " + std::strerror(errno);
        return {};
    }
    std::string where = shown;
    for (const std::string& part : components(rel)) {
        where = joined(where, part);
        if (part == "." || part == "..") {
            error = where + ": '.' and '..' are not walked";
            return {};
        }
        bool made = false;
        if (create) {
            made = ::mkdirat(cur.get(), part.c_str(), mode) == 0;
            if (!made && errno != EEXIST) {
                error = "cannot create " + where + ": " + std::strerror(errno);
                return {};
            }
        }
        UniqueFd next = open_dir(cur.get(), part);
        if (next && made) (void)::fchmod(next.get(), mode);  // the mode asked for, whatever the umask
        if (!next) {
            error = "cannot open " + where + (errno == ELOOP || errno == ENOTDIR
                                                  ? ": it is not a directory (a link is never followed)"
                                                  : std::string(": ") + std::strerror(errno));
            return {};
        }
        cur = std::move(next);
    }
    return cur;
}

UniqueFd open_absolute(const std::string& path, bool create, mode_t mode, std::string& error) {
    if (path.empty() || path[0] != '/') {
        error = "not an absolute path: " + path;
        return {};
    }
    UniqueFd root(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root) {
        error = std::string("cannot open /: ") + std::strerror(errno);
        return {};
    }
    return walk(root.get(), "/", path.substr(1), create, mode, error);
}

bool write_file(int dirfd, const std::string& shown, const std::string& name, const std::string& content,
                mode_t mode, std::string& error) {
    const std::string where = joined(shown, name);
    UniqueFd fd(::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode));
    if (!fd) {
        error = "cannot create " + where + ": " + std::strerror(errno);
        return false;
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        error = where + " is not a regular file";
        return false;
    }
    if (::fchmod(fd.get(), mode) != 0 ||
        ::write(fd.get(), content.data(), content.size()) != ssize_t(content.size())) {
        error = "cannot write " + where + ": " + std::strerror(errno);
        return false;
    }
    return true;
}

bool remove_tree(int dirfd, const std::string& name, std::string* error, const std::function<void()>& before_step) {
    if (error) error->clear();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
        if (error) *error = "not one path component: " + name;
        return false;
    }
    return remove_below(dirfd, name, 0, error, before_step);
}

}  // namespace vrdma::fs
