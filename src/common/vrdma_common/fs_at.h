// File work relative to directory fds that never follows a symbolic link in
// any component and never resolves a path twice (docs/reliability.md, "The
// host's files"). A root shim writes and removes files in trees that other
// users must not be able to redirect: each step opens the next component
// with O_NOFOLLOW from the fd of the one before, so a component swapped for
// a link fails that step instead of leading elsewhere.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

#include "vrdma_common/unique_fd.h"

namespace vrdma::fs {

// Opens the directory `name` (one component) in `dirfd` without following a
// link: O_RDONLY|O_DIRECTORY|O_NOFOLLOW. -1 with errno on failure.
UniqueFd open_dir(int dirfd, const std::string& name);

// Walks `rel` ("a/b/c", no "." or "..") from `dirfd` one component at a
// time; with `create`, makes missing directories with `mode`. Returns the
// last directory's fd, or an empty one with `error` naming the component.
// `shown` is how `dirfd` is named in errors.
UniqueFd walk(int dirfd, const std::string& shown, const std::string& rel, bool create, mode_t mode,
              std::string& error);

// The same from "/" for an absolute path that must contain no link (pass
// what realpath() returned).
UniqueFd open_absolute(const std::string& path, bool create, mode_t mode, std::string& error);

// Creates or truncates the regular file `name` in `dirfd` and writes
// `content`; a link at `name` fails (O_NOFOLLOW).
bool write_file(int dirfd, const std::string& shown, const std::string& name, const std::string& content,
                mode_t mode, std::string& error);

// Removes `name` in `dirfd` and everything below it. Directories are
// entered by fd (openat with O_NOFOLLOW, then fdopendir) and their entries
// unlinked relative to that fd, so a directory swapped for a link at any
// moment is unlinked as a link, never followed. Trees deeper than
// kMaxRemoveDepth are left in place (false, with `error`). `before_step`,
// if set, runs before every unlink and every directory open: the tests'
// hook to swap a link in at each step.
inline constexpr int kMaxRemoveDepth = 64;
bool remove_tree(int dirfd, const std::string& name, std::string* error = nullptr,
                 const std::function<void()>& before_step = {});

}  // namespace vrdma::fs
