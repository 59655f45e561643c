// Opening a device: attach to the guest's shim, share the arena, and hand
// libibverbs a context whose command fd cannot reach any kernel.
#include "context.h"
#include "vm_events.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "events.h"
#include "import.h"
#include "on_demand.h"
#include "proc_maps.h"
#include "verbs.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/trusted_dir.h"
#include "vrdma_common/log.h"

namespace vrdma::prov {
namespace {

constexpr size_t kArenaBytes = 64u << 20;  // sparse: pages appear as rings use them
// Inside a VM the arena is a region of the VM device's memory, which the
// operator sized (vrdma-shim --guest NAME:vm-memory=SIZE): smaller.
constexpr size_t kVmArenaBytes = 2u << 20;

void free_context(ibv_context* ibctx);

verbs_context* finish_context(verbs_context* vctx, Context* ctx);

const verbs_context_ops kContextOps = {
    .advise_mr = advise_mr,
    .alloc_dm = alloc_dm,
    .alloc_mw = alloc_mw,
    .alloc_parent_domain = alloc_parent_domain,
    .alloc_pd = alloc_pd,
    .async_event = async_event,
    .attach_mcast = attach_mcast,
    .bind_mw = bind_mw,
    .close_xrcd = close_xrcd,
    .cq_event = cq_event,
    .create_ah = create_ah,
    .create_cq = create_cq,
    .create_cq_ex = create_cq_ex,
    .create_qp = create_qp,
    .create_qp_ex = create_qp_ex,
    .create_srq = create_srq,
    .create_srq_ex = create_srq_ex,
    .dealloc_mw = dealloc_mw,
    .dealloc_pd = dealloc_pd,
    .dereg_mr = dereg_mr,
    .destroy_ah = destroy_ah,
    .destroy_cq = destroy_cq,
    .destroy_qp = destroy_qp,
    .destroy_srq = destroy_srq,
    .detach_mcast = detach_mcast,
    .free_context = free_context,
    .free_dm = free_dm,
    .get_srq_num = get_srq_num,
    .import_dm = import_dm,
    .import_mr = import_mr,
    .import_pd = import_pd,
    .modify_qp = modify_qp,
    .modify_srq = modify_srq,
    .open_xrcd = open_xrcd,
    .poll_cq = poll_cq,
    .post_recv = post_recv,
    .post_send = post_send,
    .post_srq_ops = post_srq_ops,
    .post_srq_recv = post_srq_recv,
    .query_device_ex = query_device_ex,
    .query_port = query_port,
    .query_qp = query_qp,
    .query_rt_values = query_rt_values,
    .query_srq = query_srq,
    .reg_dm_mr = reg_dm_mr,
    .reg_mr = reg_mr,
    .req_notify_cq = req_notify_cq,
    .rereg_mr = rereg_mr,
    .resize_cq = resize_cq,
    .unimport_dm = unimport_dm,
    .unimport_mr = unimport_mr,
    .unimport_pd = unimport_pd,
};

verbs_context* finish_context(verbs_context* vctx, Context* ctx) {
    vctx->context.num_comp_vectors = int(abi::kCompVectors);
    verbs_set_ops(vctx, &kContextOps);
    register_context(&vctx->context, ctx);
    return vctx;
}

bool read_socket_attr(const char* ibdev_path, std::string& out) {
    std::ifstream f(std::string(ibdev_path) + "/" + abi::kSocketAttr);
    if (!f) return false;
    std::getline(f, out);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\r'))
        out.pop_back();
    return !out.empty();
}

// Inside a VM: the agent gives a region of the VM device's memory for the
// arena and the device's BARs (VmOpen); the arena is that region, mapped
// here, and Attach names where.
int attach_in_vm(Context& ctx) {
    const char* path = ctx.socket_path.c_str();
    abi::SockAttach msg{};
    msg.hdr = {abi::kMagic, abi::kVersion, abi::SockOp::VmOpen, 0};
    msg.arena_len = kVmArenaBytes;
    abi::SockReply reply{};
    std::vector<UniqueFd> bars;
    int rc = sock_request(ctx, &msg, sizeof(msg), {}, &reply, &bars);
    if (rc || bars.size() != 2) {
        LOG_ERR("the VM's vrdma agent at %s gave no arena: %s", path,
                reply.message[0] ? reply.message : std::strerror(rc ? rc : EPROTO));
        return rc ? rc : EPROTO;
    }
    ctx.vm_bar2 = std::move(bars[0]);
    ctx.vm_bar0 = std::move(bars[1]);
    void* base = ::mmap(nullptr, kVmArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED, ctx.vm_bar2.get(),
                        off_t(uint64_t(reply.arg) * abi::kPageSize));
    if (base == MAP_FAILED) return errno;
    ctx.arena_base = base;
    ctx.arena_len = kVmArenaBytes;
    ctx.cb = static_cast<abi::ControlBlock*>(base);
    // Where /proc/self/maps says the arena's mapping starts, less where it
    // does: what the device file's offsets there still have in excess (the
    // BAR's address the first time, nothing for a later context). One
    // measurement at a time, or two first contexts would both add it.
    static std::mutex bias_mu;
    std::lock_guard bias_lock(bias_mu);
    struct stat st{};
    if (::fstat(ctx.vm_bar2.get(), &st) == 0)
        for (const MapEntry& e : read_maps(false))
            if (e.start == reinterpret_cast<uintptr_t>(base) && e.inode == st.st_ino)
                add_maps_offset_bias(st.st_dev, st.st_ino, e.offset - uint64_t(reply.arg) * abi::kPageSize);
    void* regs = ::mmap(nullptr, abi::kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, ctx.vm_bar0.get(), 0);
    if (regs == MAP_FAILED) return errno;
    ctx.vm_regs = regs;
    ctx.cmd_done.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));  // never written: the shim cannot reach it
    int ap[2];
    if (!ctx.cmd_done || ::pipe2(ap, O_CLOEXEC) != 0) return errno;
    // The agent keeps the pipe's write end, as a host shim does: when the
    // device goes (the shim stopped answering, or the agent itself went) it
    // is closed, and the end of file is IBV_EVENT_DEVICE_FATAL here.
    UniqueFd async_w(ap[1]);
    ctx.vm_async_w.reset(::fcntl(ap[1], F_DUPFD_CLOEXEC, 0));
    if (!ctx.vm_async_w || ::fcntl(ctx.vm_async_w.get(), F_SETFL, O_NONBLOCK) != 0) {
        ::close(ap[0]);
        return errno;
    }
    msg.hdr.op = abi::SockOp::Attach;
    msg.arena_gva = reinterpret_cast<uintptr_t>(base);
    const int pass[1] = {async_w.get()};
    rc = sock_request(ctx, &msg, sizeof(msg), pass, &reply);
    async_w.reset();
    if (rc) {
        ::close(ap[0]);
        LOG_ERR("the VM's vrdma agent at %s refused to attach: %s", path,
                reply.message[0] ? reply.message : std::strerror(rc));
        return rc;
    }
    ctx.lid = reply.guest_lid;
    ctx.arena.add_region(msg.arena_gva + abi::kControlBlockBytes, kVmArenaBytes - abi::kControlBlockBytes);
    rc = command(ctx, abi::CmdOp::QueryDevice, nullptr, 0, &ctx.dev_attr, sizeof(ctx.dev_attr));
    if (rc) {
        ::close(ap[0]);
        LOG_ERR("querying the vrdma device at %s failed: %s", path, std::strerror(rc));
        return rc;
    }
    ctx.vctx->context.async_fd = ap[0];
    vm_events_start(ctx);  // the async events, and later the completion events
    return 0;
}

int attach(Context& ctx) {
    const char* path = ctx.socket_path.c_str();
    // Nothing (the arena, eventfds, memory) goes to a socket before it is
    // known to be a trusted shim's: its directories belong to root or the
    // shim's user, nobody else can change them, and the shim's user listens.
    std::string why;
    int err = 0;
    switch (connect_to_shim(ctx.socket_path, ctx.sock, why, &err)) {
    case ShimConnect::Ok:
        break;
    case ShimConnect::Untrusted:
        LOG_ERR("not attaching to %s: %s", path, why.c_str());
        return EPERM;
    case ShimConnect::ConnectFailed:
        LOG_ERR("cannot connect to the vrdma shim at %s: %s (is vrdma-shim running?)", path,
                why.c_str());
        return err ? err : ECONNREFUSED;
    }

    if (ctx.in_vm) return attach_in_vm(ctx);
    if (int rc = create_shared_memfd("vrdma-arena", kArenaBytes, ctx.arena_fd)) return rc;
    void* base = ::mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED, ctx.arena_fd.get(), 0);
    if (base == MAP_FAILED) return errno;
    ctx.arena_base = base;
    ctx.arena_len = kArenaBytes;
    ctx.cb = static_cast<abi::ControlBlock*>(base);

    ctx.kick.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    ctx.cmd_done.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!ctx.kick || !ctx.cmd_done) return errno;
    int ap[2];
    if (::pipe2(ap, O_CLOEXEC) != 0) return errno;
    UniqueFd async_r(ap[0]), async_w(ap[1]);

    abi::SockAttach msg{};
    msg.hdr = {abi::kMagic, abi::kVersion, abi::SockOp::Attach, 0};
    msg.arena_gva = reinterpret_cast<uintptr_t>(base);
    msg.arena_len = kArenaBytes;
    int fds[4] = {ctx.arena_fd.get(), ctx.kick.get(), ctx.cmd_done.get(), async_w.get()};
    abi::SockReply reply{};
    int rc = sock_request(ctx, &msg, sizeof(msg), fds, &reply);
    if (rc) {
        LOG_ERR("the vrdma shim at %s refused to attach: %s", path,
                reply.message[0] ? reply.message : std::strerror(rc));
        return rc;
    }
    ctx.lid = reply.guest_lid;
    async_w.reset();

    record_attach_arena(ctx, ctx.arena_fd.get(), msg.arena_gva, kArenaBytes);
    ctx.arena.add_region(msg.arena_gva + abi::kControlBlockBytes, kArenaBytes - abi::kControlBlockBytes);

    rc = command(ctx, abi::CmdOp::QueryDevice, nullptr, 0, &ctx.dev_attr, sizeof(ctx.dev_attr));
    if (rc) {
        LOG_ERR("querying the vrdma device at %s failed: %s", path,
                std::strerror(rc));
        return rc;
    }
    ctx.vctx->context.async_fd = async_r.release();
    return 0;
}

void free_context(ibv_context* ibctx) {
    auto* vctx = reinterpret_cast<verbs_context*>(reinterpret_cast<char*>(ibctx) -
                                                   offsetof(verbs_context, context));
    auto* shell = reinterpret_cast<ContextShell*>(vctx);
    unregister_context(ibctx);
    // The last of the ibv_contexts over it (an import shares it) detaches.
    if (shell->impl->users.fetch_sub(1) == 1) delete shell->impl;
    verbs_uninit_context(&shell->vctx);
    std::free(shell);
}

}  // namespace

Context::~Context() {
    vm_events_stop(*this);
    if (in_vm && !dead.load(std::memory_order_relaxed)) release_vm_arena_segments(*this);
    sock.reset();  // detaches: the shim drops every resource of this context
    for (auto& [obj, del] : zombies) del(obj);
    for (auto& [id, s] : segments.segs)
        if (s.arena && id != 0 && s.len) ::munmap(reinterpret_cast<void*>(s.gva), s.len);
    if (arena_base) ::munmap(arena_base, arena_len);
    if (vm_regs) ::munmap(vm_regs, abi::kPageSize);
}

verbs_context* alloc_context(ibv_device* device, int cmd_fd, void* private_data) {
    if (ImportRequest* req = as_import_request(private_data))
        return alloc_imported_context(device, cmd_fd, *req);
    auto* vdev = reinterpret_cast<verbs_device*>(device);
    std::string sock_path;
    if (!vdev->sysfs || !read_socket_attr(vdev->sysfs->ibdev_path, sock_path)) {
        LOG_ERR("%s has no readable %s attribute",
                vdev->sysfs ? vdev->sysfs->ibdev_path : "device", abi::kSocketAttr);
        if (cmd_fd >= 0) ::close(cmd_fd);
        errno = ENODEV;
        return nullptr;
    }

    auto* shell = static_cast<ContextShell*>(_verbs_init_and_alloc_context(
        device, cmd_fd, sizeof(ContextShell),
        reinterpret_cast<verbs_context*>(offsetof(ContextShell, vctx)), 0 /* RDMA_DRIVER_UNKNOWN */));
    if (!shell) return nullptr;
    verbs_context* vctx = &shell->vctx;

    auto* ctx = new (std::nothrow) Context;
    int rc = ENOMEM;
    if (ctx) {
        shell->impl = ctx;
        ctx->vctx = vctx;
        ctx->socket_path = sock_path;
        ctx->in_vm = ::access((std::string(vdev->sysfs->ibdev_path) + "/" + abi::kVmAttr).c_str(), F_OK) == 0;
        if (const char* s = std::getenv("VRDMA_POLL_SPIN")) ctx->poll_spin = uint32_t(std::strtoul(s, nullptr, 0));
        rc = attach(*ctx);
    }
    if (rc == 0) {
        // libibverbs would write kernel commands to the uverbs node (a link
        // to /dev/null, where writes "succeed"): make them fail instead, and
        // make its ioctls answer ENOTTY.
        int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (devnull < 0) {
            rc = errno;
        } else if (vctx->context.cmd_fd >= 0) {
            if (::dup3(devnull, vctx->context.cmd_fd, O_CLOEXEC) < 0) rc = errno;
            ::close(devnull);
        } else {
            vctx->context.cmd_fd = devnull;
        }
    }
    if (rc) {
        delete ctx;
        verbs_uninit_context(vctx);
        std::free(shell);
        errno = rc;
        return nullptr;
    }
    return finish_context(vctx, ctx);
}

verbs_context* alloc_imported_context(ibv_device* device, int cmd_fd, ImportRequest& req) {
    auto* shell = static_cast<ContextShell*>(_verbs_init_and_alloc_context(
        device, cmd_fd, sizeof(ContextShell),
        reinterpret_cast<verbs_context*>(offsetof(ContextShell, vctx)), 0 /* RDMA_DRIVER_UNKNOWN */));
    if (!shell) return nullptr;
    req.taken = true;
    shell->impl = req.ctx;
    shell->vctx.context.async_fd = req.async_fd;  // a duplicate: the event queue is shared, as the kernel's
    // ibv_import_device's fd is the command fd (closed by ibv_close_device),
    // in place of the one verbs_open_device opened; set before the context
    // is registered, where claim_context_of_cmd_fd reads it.
    if (cmd_fd >= 0) ::close(cmd_fd);
    shell->vctx.context.cmd_fd = req.cmd_fd;
    return finish_context(&shell->vctx, req.ctx);
}

void* alloc_ring(Context& ctx, size_t bytes) {
    std::lock_guard lock(ctx.mem_mu);
    void* p = ctx.arena.alloc(bytes);
    if (!p) {
        size_t seg = std::max<size_t>(kArenaBytes, (bytes + abi::kPageSize - 1) & ~size_t(abi::kPageSize - 1));
        void* base = nullptr;
        if (int rc = add_arena_segment(ctx, seg, &base)) {
            errno = rc;
            return nullptr;
        }
        ctx.arena.add_region(reinterpret_cast<uintptr_t>(base), seg);
        p = ctx.arena.alloc(bytes);
        if (!p) {
            errno = ENOMEM;
            return nullptr;
        }
    }
    std::memset(p, 0, bytes);
    return p;
}

void free_ring(Context& ctx, void* p) {
    if (!p) return;
    std::lock_guard lock(ctx.mem_mu);
    ctx.arena.free(p);
}

}  // namespace vrdma::prov
