// The LD_PRELOAD role of libvrdma: libc functions that the library defines
// for the whole process when vrdma-run preloads it.
//
// socket(): the kernel's RDMA netlink socket is made unavailable, so that
// libibverbs discovers devices through SYSFS_PATH (the shim's tree) even on
// a host whose kernel has RDMA netlink. Every other socket is the real one.
// (The preloaded completion-channel and async-event entry points are in
// comp_channel.cpp and async_events.cpp; see events.h.)
#include <dlfcn.h>
#include <sys/socket.h>

#include <cerrno>

#ifndef NETLINK_RDMA
#define NETLINK_RDMA 20
#endif

namespace {

using SocketFn = int (*)(int, int, int);

SocketFn real_socket() {
    static SocketFn fn = reinterpret_cast<SocketFn>(::dlsym(RTLD_NEXT, "socket"));
    return fn;
}

}  // namespace

extern "C" [[gnu::visibility("default")]] int socket(int domain, int type, int protocol) {
    if (domain == AF_NETLINK && protocol == NETLINK_RDMA) {
        errno = EPROTONOSUPPORT;
        return -1;
    }
    SocketFn fn = real_socket();
    if (!fn) {
        errno = ENOSYS;
        return -1;
    }
    return fn(domain, type, protocol);
}
