// A directory of the test's own under /tmp, removed with everything in it
// when the test ends, whether it passed or not (the removal never follows
// a link: vrdma_common/fs_at.h).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "vrdma_common/fs_at.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::test {

struct TempDir {
    std::string path;
    // `prefix`: the name's start, e.g. "vrdma-census"; the directory is
    // /tmp/PREFIX.XXXXXX, mode 0755.
    explicit TempDir(const std::string& prefix = "vrdma-test") {
        std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
        REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
        ::chmod(path.c_str(), 0755);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    ~TempDir() {
        const size_t slash = path.rfind('/');
        UniqueFd parent(::open(path.substr(0, slash).c_str(), O_RDONLY | O_DIRECTORY));
        fs::remove_tree(parent.get(), path.substr(slash + 1));
    }
};

}  // namespace vrdma::test
