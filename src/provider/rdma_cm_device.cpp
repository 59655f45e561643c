// The LD_PRELOAD role of libvrdma for rdma_cm: the kernel's UCMA character
// device, /dev/infiniband/rdma_cm, emulated for librdmacm (docs/protocol.md
// "rdma_cm").
//
// librdmacm has no provider layer: it open()s the device, checks with
// fstat() that it is a character device, and write()s each command, whose
// response the kernel writes to a pointer inside the command. Here:
//   open()   connects to the guest's rdma_cm.sock (the guest of vrdma0, in
//            SYSFS_PATH) and returns the read end of a pipe into which the
//            shim writes a byte per event it queues: poll and epoll on the
//            fd say readable exactly while events wait, O_NONBLOCK on it is
//            what makes GET_EVENT return EAGAIN, and end of file says the
//            shim is gone;
//   fstat()  says S_IFCHR for such an fd;
//   write()  forwards the command to the shim and copies the response to
//            the command's response pointer; GET_EVENT first takes one
//            byte from the pipe (blocking unless O_NONBLOCK); once the
//            shim is gone, each id gets one RDMA_CM_EVENT_DEVICE_REMOVAL,
//            as from a device that was unplugged, and a destroy is
//            answered here;
//   close()  hangs up, and the shim destroys the channel's ids.
// Every other fd and path goes to libc untouched, for one atomic load.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include <rdma/rdma_user_cm.h>

#include "vrdma/abi.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/log.h"
#include "vrdma_common/trusted_dir.h"
#include "vrdma_common/unique_fd.h"

namespace {

constexpr const char* kDevicePath = "/dev/infiniband/rdma_cm";
constexpr int kMaxFd = 1 << 16;

// What the provider keeps of an id, to answer for it once the shim is gone.
struct IdRecord {
    uint64_t uid = 0;       // librdmacm's id (0: a connection request's, not yet accepted)
    uint32_t reported = 0;  // events GET_EVENT returned for it (DESTROY_ID's events_reported)
    bool removal_told = false;
};

struct CmFile {
    vrdma::UniqueFd sock;
    uint32_t channel_id = 0;
    std::mutex mu;  // one request at a time on the socket; guards `ids`
    std::map<uint32_t, IdRecord> ids;
    bool shim_gone = false;
    // Calls in progress on it (g_table_mu): a close() during one (another
    // thread in GET_EVENT, say) leaves the file and its fd open until the
    // last returns, as the kernel keeps a file a system call holds.
    int users = 0;
    int closed_fd = -1;     // closed while in use: the fd to close after the last call
    bool orphaned = false;  // its fd number went to another file while in use: freed after the last call
    // The pipe's identity: an fd number closed behind close()'s back
    // (dup2, close_range) and reused is not taken for this file.
    dev_t dev = 0;
    ino_t ino = 0;
};

// By fd number (the pipe's read end). Entries are never freed while in the
// table: close() takes one out before it frees it.
std::atomic<CmFile*> g_files[kMaxFd];

CmFile* file_of(int fd) {
    if (fd < 0 || fd >= kMaxFd) return nullptr;
    return g_files[fd].load(std::memory_order_acquire);
}

std::mutex g_table_mu;  // CmFile::users, closed_fd and orphaned, and the files' deletion

template <typename Fn>
Fn real(const char* name) {
    return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}
using OpenFn = int (*)(const char*, int, ...);
using WriteFn = ssize_t (*)(int, const void*, size_t);
using CloseFn = int (*)(int);
using Fstat64Fn = int (*)(int, struct stat64*);

OpenFn real_open() {
    static OpenFn fn = real<OpenFn>("open");
    return fn;
}
OpenFn real_open64() {
    static OpenFn fn = real<OpenFn>("open64");
    return fn;
}
WriteFn real_write() {
    static WriteFn fn = real<WriteFn>("write");
    return fn;
}
CloseFn real_close() {
    static CloseFn fn = real<CloseFn>("close");
    return fn;
}

using FstatFn = int (*)(int, struct stat*);
FstatFn real_fstat() {
    static FstatFn fn = real<FstatFn>("fstat");
    return fn;
}

// Whether `fd` is still the pipe `f` was opened with; if not (its number
// was closed without close() and reused), the entry is dropped.
bool still_ours(int fd, CmFile* f) {
    struct stat st;
    if (real_fstat()(fd, &st) == 0 && st.st_dev == f->dev && st.st_ino == f->ino) return true;
    CmFile* stale = f;
    if (g_files[fd].compare_exchange_strong(stale, nullptr)) {
        if (f->users == 0)
            delete f;
        else
            f->orphaned = true;
    }
    return false;
}

// The file of `fd`, held for a call (null: not an rdma_cm fd).
CmFile* pin(int fd) {
    CmFile* f = file_of(fd);
    if (!f) return nullptr;
    std::lock_guard lock(g_table_mu);
    if (g_files[fd].load(std::memory_order_relaxed) != f) return nullptr;  // closed meanwhile
    if (!still_ours(fd, f)) return nullptr;
    ++f->users;
    return f;
}

// In a child after fork(): the channels are the parent's (one socket for
// both would mix their replies), so the child's use of them fails, as
// after the device went away, and its copies of the locks start free.
void forget_channels_in_child() {
    new (&g_table_mu) std::mutex;
    for (auto& slot : g_files) {
        CmFile* f = slot.load(std::memory_order_relaxed);
        if (!f) continue;
        new (&f->mu) std::mutex;
        f->users = 0;
        f->shim_gone = true;
        f->ids.clear();
    }
}

void unpin(CmFile* f) {
    if (!f) return;
    int fd = -1;
    {
        std::lock_guard lock(g_table_mu);
        if (--f->users > 0 || (f->closed_fd < 0 && !f->orphaned)) return;
        fd = f->closed_fd;
    }
    delete f;
    if (fd >= 0) real_close()(fd);
}

struct Pinned {
    CmFile* f;
    explicit Pinned(CmFile* file) : f(file) {}
    ~Pinned() {
        const int e = errno;
        unpin(f);
        errno = e;
    }
    Pinned(const Pinned&) = delete;
    Pinned& operator=(const Pinned&) = delete;
};

// RUN_DIR/NAME/rdma_cm.sock of vrdma0's guest, from its vrdma_socket attribute.
bool cm_socket_path(std::string& out) {
    const char* sysfs = std::getenv("SYSFS_PATH");
    if (!sysfs) return false;
    std::ifstream f(std::string(sysfs) + "/class/infiniband/" + vrdma::abi::kDeviceName + "/" +
                    vrdma::abi::kSocketAttr);
    std::string sock;
    if (!f || !std::getline(f, sock)) return false;
    const size_t slash = sock.rfind('/');
    if (slash == std::string::npos) return false;
    out = sock.substr(0, slash + 1) + vrdma::abi::kCmSocketName;
    return true;
}

// One request and its reply; the response bytes go to `resp` (at most
// `resp_len`). Returns 0 or an errno.
int exchange(CmFile& f, vrdma::abi::CmSockOp op, const void* body, size_t len, const int* pass_fds, void* resp,
             size_t resp_len, uint32_t* channel_id = nullptr) {
    alignas(8) uint8_t buf[sizeof(vrdma::abi::CmSockRequest) + vrdma::abi::kCmMaxCommand];
    if (len > vrdma::abi::kCmMaxCommand) return EINVAL;
    vrdma::abi::CmSockRequest req{vrdma::abi::kMagic, vrdma::abi::kVersion, op, uint32_t(len)};
    std::memcpy(buf, &req, sizeof(req));
    if (len) std::memcpy(buf + sizeof(req), body, len);
    if (f.shim_gone) return ENODEV;
    if (vrdma::send_with_fds(f.sock.get(), buf, sizeof(req) + len, std::span<const int>(pass_fds, pass_fds ? 2 : 0),
                             MSG_NOSIGNAL) < 0) {
        f.shim_gone = true;
        return ENODEV;
    }
    alignas(8) uint8_t in[sizeof(vrdma::abi::CmSockReply) + vrdma::abi::kCmMaxResponse];
    ssize_t n;
    do {
        n = ::recv(f.sock.get(), in, sizeof(in), 0);
    } while (n < 0 && errno == EINTR);
    vrdma::abi::CmSockReply rep;
    if (n < ssize_t(sizeof(rep))) {
        f.shim_gone = true;
        return ENODEV;
    }
    std::memcpy(&rep, in, sizeof(rep));
    if (rep.magic != vrdma::abi::kMagic || rep.len > size_t(n) - sizeof(rep)) return EPROTO;
    if (rep.status) return rep.status;
    if (channel_id) *channel_id = rep.channel_id;
    if (resp && resp_len) std::memcpy(resp, in + sizeof(rep), std::min<size_t>(rep.len, resp_len));
    return 0;
}

// Keeps CmFile::ids in step with the shim after a command succeeded
// (f.mu held; `resp` is what the shim answered).
void track(CmFile& f, uint32_t cmd, const uint8_t* body, size_t in, const void* resp, size_t resp_len) {
    switch (cmd) {
    case RDMA_USER_CM_CMD_CREATE_ID: {
        rdma_ucm_create_id c{};
        std::memcpy(&c, body, std::min(in, sizeof(c)));
        rdma_ucm_create_id_resp r{};
        if (resp_len < sizeof(r)) return;
        std::memcpy(&r, resp, sizeof(r));
        f.ids[r.id].uid = c.uid;
        return;
    }
    case RDMA_USER_CM_CMD_DESTROY_ID: {
        rdma_ucm_destroy_id c{};
        std::memcpy(&c, body, std::min(in, sizeof(c)));
        f.ids.erase(c.id);
        return;
    }
    case RDMA_USER_CM_CMD_ACCEPT: {
        rdma_ucm_accept c{};
        std::memcpy(&c, body, std::min(in, sizeof(c)));
        if (c.conn_param.valid) f.ids[c.id].uid = c.uid;
        return;
    }
    case RDMA_USER_CM_CMD_MIGRATE_ID: {  // the id now lives in this file (its uid: cm_write)
        rdma_ucm_migrate_id c{};
        std::memcpy(&c, body, std::min(in, sizeof(c)));
        rdma_ucm_migrate_resp r{};
        if (resp_len >= sizeof(r)) std::memcpy(&r, resp, sizeof(r));
        f.ids[c.id].reported = r.events_reported;
        return;
    }
    case RDMA_USER_CM_CMD_GET_EVENT: {
        rdma_ucm_event_resp r{};
        std::memcpy(&r, resp, std::min(resp_len, sizeof(r)));
        if (r.event == 4 /* CONNECT_REQUEST: counts on the listener, names a new id */) {
            for (auto& [h, rec] : f.ids)
                if (rec.uid == r.uid) ++rec.reported;
            f.ids[r.id];
        } else if (auto it = f.ids.find(r.id); it != f.ids.end()) {
            ++it->second.reported;
        }
        return;
    }
    default:
        return;
    }
}

// The shim is gone: the next id not yet told gets DEVICE_REMOVAL. False
// when every id has been told.
bool device_removal(CmFile& f, void* resp, size_t resp_len) {
    for (auto& [h, rec] : f.ids) {
        if (rec.removal_told || !rec.uid) continue;
        rec.removal_told = true;
        ++rec.reported;
        rdma_ucm_event_resp r{};
        r.uid = rec.uid;
        r.id = h;
        r.event = 11;  // RDMA_CM_EVENT_DEVICE_REMOVAL
        if (resp) std::memcpy(resp, &r, std::min(resp_len, sizeof(r)));
        return true;
    }
    return false;
}

void answer_destroy(CmFile& f, const uint8_t* body, size_t in, void* resp, size_t resp_len) {
    rdma_ucm_destroy_id c{};
    std::memcpy(&c, body, std::min(in, sizeof(c)));
    rdma_ucm_destroy_id_resp r{};
    if (auto it = f.ids.find(c.id); it != f.ids.end()) {
        r.events_reported = it->second.reported;
        f.ids.erase(it);
    }
    if (resp) std::memcpy(resp, &r, std::min(resp_len, sizeof(r)));
}

int cm_open(int flags) {
    std::string path;
    if (!cm_socket_path(path)) {
        errno = ENODEV;  // no vrdma device in this process: as a host without rdma_cm
        return -1;
    }
    auto* f = new (std::nothrow) CmFile;
    if (!f) {
        errno = ENOMEM;
        return -1;
    }
    std::string why;
    int err = 0;
    if (vrdma::connect_to_shim(path, f->sock, why, &err) != vrdma::ShimConnect::Ok) {
        LOG_ERR("rdma_cm: cannot use %s: %s", path.c_str(), why.c_str());
        delete f;
        errno = err ? err : ENODEV;
        return -1;
    }
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) {
        err = errno;
        delete f;
        errno = err;
        return -1;
    }
    const int efd = ends[0];
    vrdma::UniqueFd write_end(ends[1]);
    if (efd >= kMaxFd || ((flags & O_NONBLOCK) && ::fcntl(efd, F_SETFL, O_NONBLOCK) != 0)) {
        real_close()(efd);
        delete f;
        errno = EMFILE;
        return -1;
    }
    const int pass[2] = {write_end.get(), efd};
    std::unique_lock lock(f->mu);
    if (int rc = exchange(*f, vrdma::abi::CmSockOp::Open, nullptr, 0, pass, nullptr, 0, &f->channel_id)) {
        LOG_ERR("rdma_cm: the vrdma shim at %s refused the channel: %s", path.c_str(), std::strerror(rc));
        lock.unlock();
        real_close()(efd);
        delete f;
        errno = rc;
        return -1;
    }
    lock.unlock();
    struct stat st;
    if (real_fstat()(efd, &st) == 0) {
        f->dev = st.st_dev;
        f->ino = st.st_ino;
    }
    static const bool at_fork = (::pthread_atfork(nullptr, nullptr, forget_channels_in_child), true);
    (void)at_fork;
    g_files[efd].store(f, std::memory_order_release);
    return efd;  // the shim holds the write end: end of file when it is gone
}

ssize_t cm_write(int fd, CmFile& f, const void* buf, size_t len) {
    rdma_ucm_cmd_hdr hdr;
    if (len < sizeof(hdr)) {
        errno = EINVAL;
        return -1;
    }
    std::memcpy(&hdr, buf, sizeof(hdr));
    if (sizeof(hdr) + hdr.in > len || sizeof(hdr) + hdr.in > vrdma::abi::kCmMaxCommand) {
        errno = EINVAL;
        return -1;
    }
    alignas(8) uint8_t cmd[vrdma::abi::kCmMaxCommand];
    size_t cmd_len = sizeof(hdr) + hdr.in;
    std::memcpy(cmd, buf, cmd_len);
    uint8_t* body = cmd + sizeof(hdr);
    // Where the kernel would write the response: the first field, but for
    // CREATE_ID, whose first field is the caller's uid.
    uint64_t response = 0;
    const size_t resp_at = hdr.cmd == RDMA_USER_CM_CMD_CREATE_ID ? 8 : 0;
    if (hdr.out && hdr.in >= resp_at + 8) std::memcpy(&response, body + resp_at, 8);

    CmFile* from = nullptr;  // MIGRATE_ID: the file the id leaves
    Pinned hold_from(nullptr);
    if (hdr.cmd == RDMA_USER_CM_CMD_SET_OPTION) {  // its value travels after it
        rdma_ucm_set_option so{};
        std::memcpy(&so, body, std::min<size_t>(hdr.in, sizeof(so)));
        if (so.optlen > 256 || cmd_len + so.optlen > sizeof(cmd) || (so.optlen && !so.optval)) {
            errno = EINVAL;
            return -1;
        }
        std::memcpy(cmd + cmd_len, reinterpret_cast<const void*>(uintptr_t(so.optval)), so.optlen);
        cmd_len += so.optlen;
    } else if (hdr.cmd == RDMA_USER_CM_CMD_MIGRATE_ID) {  // an fd here is a channel id there
        rdma_ucm_migrate_id m{};
        std::memcpy(&m, body, std::min<size_t>(hdr.in, sizeof(m)));
        from = pin(int(m.fd));
        if (!from) {
            errno = EBADF;
            return -1;
        }
        hold_from.f = from;
        m.fd = from->channel_id;
        std::memcpy(body, &m, std::min<size_t>(hdr.in, sizeof(m)));
    }
    void* resp = reinterpret_cast<void*>(uintptr_t(response));
    const size_t resp_len = response ? hdr.out : 0;
    for (;;) {
        if (hdr.cmd == RDMA_USER_CM_CMD_GET_EVENT) {
            uint8_t b;
            const ssize_t n = ::read(fd, &b, 1);
            if (n < 0) return -1;  // EAGAIN (O_NONBLOCK) or EINTR
            std::lock_guard lock(f.mu);
            if (n == 0) f.shim_gone = true;  // end of file: the shim closed its end
            if (f.shim_gone) {
                if (!device_removal(f, resp, resp_len)) {
                    errno = EAGAIN;  // every id has been told
                    return -1;
                }
                return ssize_t(len);
            }
        }
        int rc;
        {
            std::lock_guard lock(f.mu);
            if (f.shim_gone && hdr.cmd == RDMA_USER_CM_CMD_DESTROY_ID) {
                answer_destroy(f, body, hdr.in, resp, resp_len);
                return ssize_t(len);
            }
            rc = exchange(f, vrdma::abi::CmSockOp::Command, cmd, cmd_len, nullptr, resp, resp_len);
            if (rc == 0) track(f, hdr.cmd, body, hdr.in, resp, resp_len);
            // The shim went between the byte and the event: the device's removal is the event.
            if (rc == ENODEV && f.shim_gone && hdr.cmd == RDMA_USER_CM_CMD_GET_EVENT) {
                if (device_removal(f, resp, resp_len)) return ssize_t(len);
                rc = EAGAIN;
                errno = EAGAIN;
                return -1;
            }
        }
        if (rc == EAGAIN && hdr.cmd == RDMA_USER_CM_CMD_GET_EVENT) continue;  // its event went with its id
        if (rc) {
            errno = rc;
            return -1;
        }
        if (from && from != &f) {  // the id's uid follows it, one file locked at a time
            rdma_ucm_migrate_id m{};
            std::memcpy(&m, body, std::min<size_t>(hdr.in, sizeof(m)));
            uint64_t uid = 0;
            {
                std::lock_guard other(from->mu);
                if (auto it = from->ids.find(m.id); it != from->ids.end()) {
                    uid = it->second.uid;
                    from->ids.erase(it);
                }
            }
            std::lock_guard lock(f.mu);
            f.ids[m.id].uid = uid;
        }
        return ssize_t(len);
    }
}

void fake_char_device(struct stat& st) {
    st.st_mode = S_IFCHR | 0666;
    st.st_rdev = makedev(10, 58);
}

}  // namespace

extern "C" {

// open() and open64() (the same on x86-64): the device here, anything else
// to libc's; the mode is there only with O_CREAT or O_TMPFILE.
#define VRDMA_OPEN_BODY(real_fn)                                      \
    mode_t mode = 0;                                                  \
    if (flags & (O_CREAT | O_TMPFILE)) {                              \
        va_list ap;                                                   \
        va_start(ap, flags);                                          \
        mode = mode_t(va_arg(ap, int));                               \
        va_end(ap);                                                   \
    }                                                                 \
    if (std::strcmp(path, kDevicePath) == 0) return cm_open(flags);   \
    return real_fn()(path, flags, mode)

[[gnu::visibility("default")]] int open(const char* path, int flags, ...) { VRDMA_OPEN_BODY(real_open); }

[[gnu::visibility("default")]] int open64(const char* path, int flags, ...) { VRDMA_OPEN_BODY(real_open64); }

#undef VRDMA_OPEN_BODY

[[gnu::visibility("default")]] ssize_t write(int fd, const void* buf, size_t len) {
    if (file_of(fd)) {  // (one load for every other fd)
        if (CmFile* f = pin(fd)) {
            Pinned hold(f);
            return cm_write(fd, *f, buf, len);
        }
    }
    return real_write()(fd, buf, len);
}

[[gnu::visibility("default")]] int close(int fd) {
    if (file_of(fd)) {
        std::unique_lock lock(g_table_mu);
        if (CmFile* f = g_files[fd].exchange(nullptr, std::memory_order_acq_rel)) {
            if (f->users > 0) {  // the last call in progress closes it
                f->closed_fd = fd;
                return 0;
            }
            lock.unlock();
            delete f;
        }
    }
    return real_close()(fd);
}

[[gnu::visibility("default")]] int fstat(int fd, struct stat* st) {
    const int rc = real_fstat()(fd, st);
    if (rc == 0) {
        if (CmFile* f = file_of(fd); f && st->st_dev == f->dev && st->st_ino == f->ino) fake_char_device(*st);
    }
    return rc;
}

[[gnu::visibility("default")]] int fstat64(int fd, struct stat64* st) {
    static Fstat64Fn fn = real<Fstat64Fn>("fstat64");
    const int rc = fn(fd, st);
    CmFile* f = rc == 0 ? file_of(fd) : nullptr;
    if (f && st->st_dev == f->dev && st->st_ino == f->ino) {
        st->st_mode = S_IFCHR | 0666;
        st->st_rdev = makedev(10, 58);
    }
    return rc;
}

}  // extern "C"
