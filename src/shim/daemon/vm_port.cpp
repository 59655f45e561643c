#include "vm_port.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "vrdma/abi.h"
#include "vrdma_common/fd_passing.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {

VmPort::~VmPort() { disconnect(nullptr); }

bool VmPort::make_memory(std::string& error) {
    memory_.reset(::memfd_create(("vrdma-vm-" + guest_.name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!memory_ || ::ftruncate(memory_.get(), off_t(memory_bytes_)) != 0 ||
        ::fcntl(memory_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        error = std::string("its memory: ") + strerror(errno);
        return false;
    }
    map_ = ::mmap(nullptr, memory_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, memory_.get(), 0);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        error = std::string("mapping its memory: ") + strerror(errno);
        return false;
    }
    abi::VmDevicePage* p = page();
    p->magic = abi::kVmMagic;
    p->version = abi::kVmVersion;
    p->page_size = abi::kPageSize;
    p->memory_bytes = memory_bytes_;
    p->guid = guest_.guid;
    p->lid = guest_.lid;
    p->vm_peer = abi::kVmPeer;
    std::strncpy(p->guest_name, guest_.name.c_str(), sizeof(p->guest_name) - 1);
    p->shim_state.store(abi::kShimRunning, std::memory_order_release);
    p->kicks.store(0, std::memory_order_release);
    free_.clear();
    used_.clear();
    owners_.clear();
    answered_ = 0;
    free_[abi::kVmHeapOffset] = memory_bytes_ - abi::kVmHeapOffset;
    return true;
}

bool VmPort::send_message(int64_t value, int fd, std::string& error) {
    // Little-endian on the wire; this is an x86-64 or arm64 host.
    const int fds[1] = {fd};
    if (int err = send_with_fds(sock_.get(), &value, sizeof(value), std::span<const int>(fds, fd >= 0 ? 1 : 0),
                                MSG_DONTWAIT)) {
        error = std::string("sending to QEMU: ") + strerror(err);
        return false;
    }
    return true;
}

bool VmPort::adopt(UniqueFd sock, pid_t pid) {
    if (sock_) {
        LOG_WARN("guest %s: a second QEMU (pid %d) connected to its ivshmem.sock while %s serves the VM: refused",
                 guest_.name.c_str(), int(pid), qemu_.c_str());
        return false;
    }
    sock_ = std::move(sock);
    qemu_ = "QEMU pid " + std::to_string(pid);
    std::string error;
    bool ok = make_memory(error);
    for (uint32_t v = 0; ok && v < abi::kVmVectors; ++v) {
        bells_in_.emplace_back(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        bells_out_.emplace_back(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        if (!bells_in_.back() || !bells_out_.back()) {
            error = std::string("eventfd: ") + strerror(errno);
            ok = false;
        }
    }
    // The server's side of QEMU's ivshmem protocol: the version, the VM's
    // ID, the memory; then the shim as peer 0 (the fds QEMU writes to ring
    // it, by vector) and the VM's own vectors (the fds the shim writes to
    // interrupt it).
    ok = ok && send_message(0, -1, error) && send_message(abi::kVmPeer, -1, error) &&
         send_message(-1, memory_.get(), error);
    for (uint32_t v = 0; ok && v < abi::kVmVectors; ++v) ok = send_message(abi::kVmShimPeer, bells_in_[v].get(), error);
    for (uint32_t v = 0; ok && v < abi::kVmVectors; ++v) ok = send_message(abi::kVmPeer, bells_out_[v].get(), error);
    if (!ok) {
        LOG_WARN("guest %s: %s: %s", guest_.name.c_str(), qemu_.c_str(), error.c_str());
        disconnect(nullptr);
        return false;
    }
    LOG_INFO("guest %s: %s connected: the VM's device has %llu MiB of memory, %u vectors", guest_.name.c_str(),
             qemu_.c_str(), (unsigned long long)(memory_bytes_ >> 20), abi::kVmVectors);
    return true;
}

void VmPort::on_kick() {
    uint64_t n = 0;
    if (::read(kick_fd(), &n, sizeof(n)) != sizeof(n)) return;
    kicks_ += n;
    page()->kicks.store(kicks_, std::memory_order_release);
    serve_mailbox();
    // A ring does not say whose doorbell it was: every context looks.
    for (auto& [id, o] : owners_)
        if (o.ctx_id)
            if (Context* ctx = eng_.find_context(o.ctx_id)) eng_.wake(*ctx);
}

void VmPort::serve_mailbox() {
    auto* mb = reinterpret_cast<abi::VmMailbox*>(static_cast<uint8_t*>(map_) + abi::kVmMailboxOffset);
    const uint32_t seq = mb->request_seq.load(std::memory_order_acquire);
    if (seq == answered_) return;
    // Copied out first, then checked: the VM may change it meanwhile.
    abi::VmRequest q;
    std::memcpy(&q, &mb->request, sizeof(q));
    abi::VmReply r{};
    handle(q, r);
    std::memcpy(&mb->reply, &r, sizeof(r));
    mb->reply_seq.store(seq, std::memory_order_release);
    answered_ = seq;
}

void VmPort::handle(const abi::VmRequest& q, abi::VmReply& r) {
    const char* why = "";
    std::string long_why;
    if (q.owner == 0 && q.op != abi::VmOp::Ping) {
        r.status = EINVAL;
        why = "owner 0";
    } else {
        switch (q.op) {
        case abi::VmOp::Alloc:
            r.status = alloc(q.owner, q.len, r.offset, why);
            break;
        case abi::VmOp::Free:
            r.status = free_region(q.owner, q.offset, why);
            break;
        case abi::VmOp::Attach:
            r.status = attach(q.owner, q.offset, q.len, q.gva, long_why);
            why = long_why.c_str();
            if (!r.status) r.lid = guest_.lid;
            break;
        case abi::VmOp::Close:
            close_owner(q.owner);
            break;
        case abi::VmOp::Detach:
            if (auto o = owners_.find(q.owner); o != owners_.end() && o->second.ctx_id) {
                eng_.detach(o->second.ctx_id);
                o->second.ctx_id = 0;
            }
            break;
        case abi::VmOp::AddSegment:
            r.status = add_segment(q, long_why);
            why = long_why.c_str();
            break;
        case abi::VmOp::RemoveSegment:
            r.status = remove_segment(q, long_why);
            why = long_why.c_str();
            break;
        case abi::VmOp::Ping:
            break;
        default:
            r.status = EINVAL;
            why = "unknown request";
        }
    }
    if (r.status) {
        std::snprintf(r.message, sizeof(r.message), "%s", why);
        LOG_DEBUG("guest %s: mailbox request %u of owner %llu refused: %s", guest_.name.c_str(), unsigned(q.op),
                  (unsigned long long)q.owner, why);
    }
}

int VmPort::alloc(uint64_t owner, uint64_t len, uint64_t& offset, const char*& why) {
    if (len == 0 || len % abi::kPageSize || len > memory_bytes_) {
        why = "the length is not a page multiple of the device's memory";
        return EINVAL;
    }
    auto o = owners_.find(owner);
    if (o == owners_.end() && owners_.size() >= abi::kVmMaxOwners) {
        why = "too many owners (processes) on this VM's device";
        return ENOMEM;
    }
    if (o != owners_.end() && o->second.regions >= abi::kVmMaxRegionsPerOwner) {
        why = "too many regions for one owner";
        return ENOMEM;
    }
    for (auto f = free_.begin(); f != free_.end(); ++f) {
        if (f->second < len) continue;
        offset = f->first;
        const uint64_t rest = f->second - len;
        free_.erase(f);
        if (rest) free_[offset + len] = rest;
        used_[offset] = Region{len, owner};
        ++owners_[owner].regions;
        zero(offset, len);
        return 0;
    }
    why = "the VM device's memory is full (vrdma-shim --guest NAME:vm-memory=SIZE)";
    return ENOMEM;
}

int VmPort::free_region(uint64_t owner, uint64_t offset, const char*& why) {
    auto u = used_.find(offset);
    if (u == used_.end() || u->second.owner != owner) {
        why = "no region of this owner there";
        return EINVAL;
    }
    Owner& o = owners_[owner];
    if (o.ctx_id && o.arena_offset == offset) {
        why = "the region is an attached context's arena";
        return EBUSY;
    }
    uint64_t start = offset, len = u->second.len;
    used_.erase(u);
    --o.regions;
    zero(start, len);
    // Joined with its free neighbours.
    auto next = free_.find(start + len);
    if (next != free_.end()) {
        len += next->second;
        free_.erase(next);
    }
    auto prev = free_.lower_bound(start);
    if (prev != free_.begin() && std::prev(prev)->first + std::prev(prev)->second == start) {
        --prev;
        prev->second += len;
    } else {
        free_[start] = len;
    }
    return 0;
}

int VmPort::attach(uint64_t owner, uint64_t offset, uint64_t len, uint64_t gva, std::string& why) {
    auto u = used_.find(offset);
    if (u == used_.end() || u->second.owner != owner || u->second.len != len) {
        why = "the arena is not a region of this owner, of that length";
        return EINVAL;
    }
    Owner& o = owners_[owner];
    if (o.ctx_id) {
        why = "this owner has a context already";
        return EBUSY;
    }
    UniqueFd arena(::fcntl(memory_.get(), F_DUPFD_CLOEXEC, 0));
    UniqueFd kick(::fcntl(kick_fd(), F_DUPFD_CLOEXEC, 0));
    if (!arena || !kick) {
        why = std::string("dup: ") + strerror(errno);
        return EMFILE;
    }
    int err = 0;
    // The kick is the VM's own (every context of the VM is woken by it):
    // the context holds a copy so that it may go dormant.
    Context* ctx =
        eng_.attach(guest_, std::move(arena), gva, len, std::move(kick), UniqueFd(), UniqueFd(), err, &why, offset);
    if (!ctx) return err;
    ctx->use_vm_async_ring();  // the VM's processes cannot be handed a pipe of the shim's
    o.ctx_id = ctx->id();
    o.arena_offset = offset;
    LOG_INFO("guest %s: %s: context %llu attached (owner %llu, arena %llu KiB at 0x%llx)", guest_.name.c_str(),
             qemu_.c_str(), (unsigned long long)ctx->id(), (unsigned long long)owner,
             (unsigned long long)(len >> 10), (unsigned long long)offset);
    return 0;
}

Context* VmPort::context_of(uint64_t owner) {
    auto o = owners_.find(owner);
    return o == owners_.end() || !o->second.ctx_id ? nullptr : eng_.find_context(o->second.ctx_id);
}

// As a host process's AddSegment (attach.cpp), with the device's memory for
// the memfd: the range must lie in one allocated region. Of any owner: the
// VM is one tenant (its processes can map all of the device's memory), and
// a process's later context registers again the pages an earlier one moved
// onto that one's region, which stays allocated until the process exits.
int VmPort::add_segment(const abi::VmRequest& q, std::string& why) {
    Context* ctx = context_of(q.owner);
    if (!ctx) {
        why = "no attached context of this owner";
        return EINVAL;
    }
    auto u = used_.upper_bound(q.offset);
    if (u == used_.begin() || q.len == 0 || q.offset + q.len < q.offset) {
        why = "the range is in no allocated region";
        return EINVAL;
    }
    --u;
    if (q.offset + q.len > u->first + u->second.len) {
        why = "the range is in no allocated region";
        return EINVAL;
    }
    if (q.seg_id == 0 || ctx->segments.has(q.seg_id)) {
        why = "segment id 0 or in use";
        return EEXIST;
    }
    if (ctx->segments.piece_count() >= 65536) {
        why = "too many segments";
        return ENOMEM;
    }
    UniqueFd fd(::fcntl(memory_.get(), F_DUPFD_CLOEXEC, 0));
    std::shared_ptr<Mapping> map;
    if (int err = map_segment(std::move(fd), q.gva, q.len, q.offset, map, ctx->charges.usage(), &why)) return err;
    ctx->segments.insert(q.seg_id, std::move(map));
    return 0;
}

int VmPort::remove_segment(const abi::VmRequest& q, std::string& why) {
    Context* ctx = context_of(q.owner);
    if (!ctx || q.seg_id == 0 || !ctx->segments.remove(q.seg_id)) {
        why = "no such segment of this owner";
        return ENOENT;
    }
    return 0;
}

void VmPort::close_owner(uint64_t owner) {
    auto o = owners_.find(owner);
    if (o == owners_.end()) return;
    if (o->second.ctx_id) eng_.detach(o->second.ctx_id);
    o->second.ctx_id = 0;
    std::vector<uint64_t> mine;
    for (auto& [off, r] : used_)
        if (r.owner == owner) mine.push_back(off);
    const char* unused;
    for (uint64_t off : mine) free_region(owner, off, unused);
    owners_.erase(owner);
}

void VmPort::zero(uint64_t offset, uint64_t len) {
    if (::fallocate(memory_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(offset), off_t(len)) != 0)
        std::memset(static_cast<uint8_t*>(map_) + offset, 0, len);
}

void VmPort::disconnect(const char* why) {
    if (why && sock_) LOG_INFO("guest %s: %s gone (%s): the VM's device is free", guest_.name.c_str(), qemu_.c_str(), why);
    for (auto& [id, o] : owners_)
        if (o.ctx_id) eng_.detach(o.ctx_id);
    owners_.clear();
    used_.clear();
    free_.clear();
    if (map_) {
        page()->shim_state.store(abi::kShimFatal, std::memory_order_release);
        ::munmap(map_, memory_bytes_);
        map_ = nullptr;
    }
    memory_.reset();
    bells_in_.clear();
    bells_out_.clear();
    sock_.reset();
    kicks_ = 0;
}

}  // namespace vrdma::shim
