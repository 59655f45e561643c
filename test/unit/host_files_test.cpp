// The host's files (docs/reliability.md "The host's files"): the tree
// removal never follows a link, whatever is swapped in at whatever step; a
// run directory that another user can change is refused, naming the
// directory and the owner or mode at fault; a client connects only to a
// socket a trusted shim user placed and listens on. The ownership cases need
// root (to give files to another user) and are skipped otherwise.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "run_dir.h"
#include "temp_dir.h"
#include "vrdma_common/fs_at.h"
#include "vrdma_common/trusted_dir.h"

using namespace vrdma;
using vrdma::test::TempDir;

namespace {

constexpr uid_t kNobody = 65534;

bool exists(const std::string& p) {
    struct stat st;
    return ::lstat(p.c_str(), &st) == 0;
}

void touch(const std::string& p, const std::string& text = "x") { std::ofstream(p) << text; }

std::string read_all(const std::string& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The tree the removal is run on, and the directories in it a hostile owner
// could swap for a link.
const std::vector<std::string> kTreeDirs = {"t", "t/a", "t/a/b", "t/x", "t/y", "t/y/z"};

void make_tree(const std::string& base) {
    for (const auto& d : kTreeDirs) REQUIRE(::mkdir((base + "/" + d).c_str(), 0755) == 0);
    for (const char* f : {"t/f", "t/a/f1", "t/a/b/f2", "t/a/b/f3", "t/x/f4", "t/y/z/f5"}) touch(base + "/" + f);
}

void make_victim(const std::string& victim) {
    REQUIRE(::mkdir(victim.c_str(), 0700) == 0);
    REQUIRE(::mkdir((victim + "/sub").c_str(), 0700) == 0);
    // Names that are also in the tree: a followed link would remove them.
    for (const char* f : {"f", "f1", "f2", "f3", "f4", "f5", "sub/f2"}) touch(victim + "/" + f, "precious");
}

void check_victim(const std::string& victim) {
    for (const char* f : {"f", "f1", "f2", "f3", "f4", "f5", "sub/f2"}) {
        INFO("victim file " << f);
        REQUIRE(read_all(victim + "/" + f) == "precious");
    }
}

}  // namespace

TEST_CASE("the tree removal removes a whole tree and reports what it could not", "[hostfiles]") {
    TempDir tmp("vrdma-hostfiles");
    make_tree(tmp.path);
    UniqueFd base(::open(tmp.path.c_str(), O_RDONLY | O_DIRECTORY));
    std::string error;
    REQUIRE(fs::remove_tree(base.get(), "t", &error));
    CHECK(error.empty());
    CHECK_FALSE(exists(tmp.path + "/t"));
    CHECK(fs::remove_tree(base.get(), "t", &error));  // gone already: nothing to do
    CHECK_FALSE(fs::remove_tree(base.get(), "../etc", &error));
    CHECK(error.find("not one path component") != std::string::npos);

    // Deeper than the limit: left in place, with the reason.
    std::string deep = tmp.path + "/deep";
    REQUIRE(::mkdir(deep.c_str(), 0755) == 0);
    for (int i = 0; i < fs::kMaxRemoveDepth + 2; ++i) {
        deep += "/d";
        REQUIRE(::mkdir(deep.c_str(), 0755) == 0);
    }
    CHECK_FALSE(fs::remove_tree(base.get(), "deep", &error));
    CHECK(error.find("nested deeper") != std::string::npos);
}

TEST_CASE("the tree removal never follows a link swapped in at any step", "[hostfiles]") {
    TempDir tmp("vrdma-hostfiles");
    const std::string victim = tmp.path + "/victim";
    make_victim(victim);
    UniqueFd base(::open(tmp.path.c_str(), O_RDONLY | O_DIRECTORY));

    // How many steps a removal of the tree takes.
    make_tree(tmp.path);
    int steps = 0;
    REQUIRE(fs::remove_tree(base.get(), "t", nullptr, [&] { ++steps; }));
    REQUIRE(steps > 10);

    int swaps = 0;
    for (const auto& target : kTreeDirs) {
        for (int at = 0; at < steps; ++at) {
            make_tree(tmp.path);
            int step = 0;
            const std::string dir = tmp.path + "/" + target;
            // At step `at`, `target` (if it is still a directory) is moved
            // aside and a link to the victim put in its place.
            fs::remove_tree(base.get(), "t", nullptr, [&] {
                if (step++ != at) return;
                struct stat st;
                if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
                if (::rename(dir.c_str(), (dir + ".aside").c_str()) != 0) return;
                REQUIRE(::symlink(victim.c_str(), dir.c_str()) == 0);
                ++swaps;
            });
            INFO("swapped " << target << " at step " << at);
            check_victim(victim);
            // Whatever is left (the moved-aside part) goes before the next round.
            fs::remove_tree(base.get(), "t");
            REQUIRE_FALSE(exists(tmp.path + "/t"));
        }
    }
    CHECK(swaps > 2 * steps);  // the swaps did happen, at many steps
}

TEST_CASE("a run directory that another user can change is refused with the reason", "[hostfiles]") {
    if (::geteuid() != 0) {
        WARN("not root: the ownership cases are skipped");
        return;
    }
    TempDir tmp("vrdma-hostfiles");
    shim::RunDir run;
    std::string error;

    SECTION("owned by another user") {
        const std::string dir = tmp.path + "/theirs";
        REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
        REQUIRE(::chown(dir.c_str(), kNobody, kNobody) == 0);
        CHECK_FALSE(run.acquire(dir, error));
        CHECK(error.find(dir) != std::string::npos);
        CHECK(error.find("uid 65534") != std::string::npos);
        CHECK_FALSE(exists(dir + "/shim.pid"));
    }
    SECTION("writable by others") {
        const std::string dir = tmp.path + "/open";
        REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
        REQUIRE(::chmod(dir.c_str(), 0777) == 0);
        CHECK_FALSE(run.acquire(dir, error));
        CHECK(error.find("mode 0777") != std::string::npos);
        REQUIRE(::chmod(dir.c_str(), 01777) == 0);  // sticky is no excuse for the run directory itself
        CHECK_FALSE(run.acquire(dir, error));
        CHECK(error.find("mode 1777") != std::string::npos);
    }
    SECTION("an ancestor another user owns, or others may write without the sticky bit") {
        const std::string parent = tmp.path + "/parent";
        REQUIRE(::mkdir(parent.c_str(), 0755) == 0);
        REQUIRE(::chown(parent.c_str(), kNobody, kNobody) == 0);
        CHECK_FALSE(run.acquire(parent + "/run", error));
        CHECK(error.find(parent + " belongs to uid 65534") != std::string::npos);
        CHECK_FALSE(exists(parent + "/run"));  // refused before anything was made
        REQUIRE(::chown(parent.c_str(), 0, 0) == 0);
        REQUIRE(::chmod(parent.c_str(), 0777) == 0);
        CHECK_FALSE(run.acquire(parent + "/run", error));
        CHECK(error.find(parent + " has mode 0777") != std::string::npos);
    }
    SECTION("under a sticky directory, made and owned by the shim: accepted") {
        const std::string sticky = tmp.path + "/sticky";
        REQUIRE(::mkdir(sticky.c_str(), 0755) == 0);
        REQUIRE(::chmod(sticky.c_str(), 01777) == 0);
        REQUIRE(run.acquire(sticky + "/a/run", error));
        CHECK(run.path() == sticky + "/a/run");
        struct stat st;
        REQUIRE(::stat(run.path().c_str(), &st) == 0);
        CHECK((st.st_mode & 07777) == 0755);
        CHECK(exists(run.path() + "/shim.pid"));
        run.release();
        CHECK_FALSE(exists(sticky + "/a/run/shim.pid"));
    }
    SECTION("a link in the path is resolved once and the real directory checked") {
        const std::string real = tmp.path + "/real";
        REQUIRE(::mkdir(real.c_str(), 0755) == 0);
        REQUIRE(::symlink(real.c_str(), (tmp.path + "/alias").c_str()) == 0);
        REQUIRE(run.acquire(tmp.path + "/alias/run", error));
        CHECK(run.path() == real + "/run");
    }
}

TEST_CASE("a client connects only to a socket a trusted shim user placed and listens on", "[hostfiles]") {
    if (::geteuid() != 0) {
        WARN("not root: the ownership cases are skipped");
        return;
    }
    TempDir tmp("vrdma-hostfiles");
    // run/guest/vrdma.sock as a shim lays it out; `owner` owns both
    // directories; the socket listens as `listener`.
    auto lay_out = [&](const std::string& run, uid_t owner, uid_t listener, pid_t& child) {
        const std::string guest = run + "/g";
        REQUIRE(::mkdir(run.c_str(), 0755) == 0);
        REQUIRE(::mkdir(guest.c_str(), 0755) == 0);
        REQUIRE(::chown(run.c_str(), owner, owner) == 0);
        REQUIRE(::chown(guest.c_str(), owner, owner) == 0);
        const std::string path = guest + "/vrdma.sock";
        int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strcpy(addr.sun_path, path.c_str());
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
        ::chmod(path.c_str(), 0666);
        int ready[2];
        REQUIRE(::pipe(ready) == 0);
        child = ::fork();
        if (child == 0) {
            // The listener's credentials are taken at listen().
            if (::setresuid(listener, listener, listener) != 0 || ::listen(fd, 4) != 0) _exit(1);
            char c = 1;
            if (::write(ready[1], &c, 1) != 1) _exit(1);
            ::pause();
            _exit(0);
        }
        char c;
        REQUIRE(::read(ready[0], &c, 1) == 1);
        ::close(ready[0]);
        ::close(ready[1]);
        ::close(fd);
        return path;
    };
    auto stop = [](pid_t child) {
        ::kill(child, SIGKILL);
        ::waitpid(child, nullptr, 0);
    };
    std::string error;
    UniqueFd sock;
    ::unsetenv("VRDMA_SHIM_UID");

    pid_t child;
    std::string path = lay_out(tmp.path + "/good", 0, 0, child);
    CHECK(connect_to_shim(path, sock, error) == ShimConnect::Ok);
    stop(child);

    path = lay_out(tmp.path + "/forged", kNobody, kNobody, child);
    sock.reset();
    CHECK(connect_to_shim(path, sock, error) == ShimConnect::Untrusted);
    CHECK(error.find("uid 65534") != std::string::npos);
    CHECK_FALSE(sock);
    ::setenv("VRDMA_SHIM_UID", "65534", 1);  // an operator's shim running as that user
    CHECK(connect_to_shim(path, sock, error) == ShimConnect::Ok);
    ::unsetenv("VRDMA_SHIM_UID");
    stop(child);

    // The directories are root's, but another user listens on the socket.
    path = lay_out(tmp.path + "/impostor", 0, kNobody, child);
    sock.reset();
    CHECK(connect_to_shim(path, sock, error) == ShimConnect::Untrusted);
    CHECK(error.find("runs as uid 65534") != std::string::npos);
    stop(child);

    // A run directory that others may write (even sticky): untrusted.
    path = lay_out(tmp.path + "/loose", 0, 0, child);
    REQUIRE(::chmod((tmp.path + "/loose").c_str(), 01777) == 0);
    CHECK(connect_to_shim(path, sock, error) == ShimConnect::Untrusted);
    CHECK(error.find("mode 1777") != std::string::npos);
    stop(child);
}
