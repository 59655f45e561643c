// vrdma-shim: see `vrdma-shim --help` and event_loop.h.
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include "event_loop.h"
#include "options.h"
#include "vrdma_common/log.h"

int main(int argc, char** argv) {
    using namespace vrdma;
    shim::Options opts;
    std::string error;
    if (!shim::parse_options(argc, argv, opts, error)) {
        std::fprintf(stderr, "vrdma-shim: %s\n", error.c_str());
        return 2;
    }
    if (opts.help) {
        std::fputs(shim::help_text().c_str(), stdout);
        return 0;
    }
    set_log_prefix("vrdma-shim");
    set_log_level(opts.log_level);

    // SIGTERM/SIGINT/SIGHUP arrive through a signalfd in the event loop.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);  // reload (--config)
    sigprocmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);

    // Every guest segment and eventfd is a file descriptor: use the hard limit.
    rlimit nofile{};
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }

    if (!opts.quotas.max_fds && getrlimit(RLIMIT_NOFILE, &nofile) == 0)
        opts.quotas.max_fds = shim::default_fd_share(uint64_t(nofile.rlim_cur), opts.guests.size());

    shim::Daemon daemon(opts);
    if (!daemon.start(error)) {
        std::fprintf(stderr, "vrdma-shim: %s\n", error.c_str());
        daemon.shutdown();
        return 1;
    }
    daemon.run();
    return 0;
}
