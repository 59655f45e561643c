// A stand-in for QEMU's ivshmem-doorbell device, for vm_device.sh: speaks
// the client side of QEMU's ivshmem server protocol to a VM guest's
// ivshmem.sock, maps the memory it is given, checks the device page the
// shim wrote (vm_abi.h), rings the shim as the VM would (vector
// kVmVectorKick of peer kVmShimPeer) and waits for the shim to count it.
//
//   vrdma-ivshmem-client SOCKET [--hold SECONDS] [--rings N] [--contexts N] [--hostile N]
//
// With --contexts N, it then plays the VM's agent and N processes through
// the mailbox: for each, a region for its arena and a context attached on
// it; each context asks QueryPort on its command ring and checks that the
// answer names the guest's LID; then it asks for what the mailbox must
// refuse (a region of another owner, an arena twice, a length past the
// memory) and closes every owner.
//
// With --hostile N, it then plays a hostile VM: N rounds of random
// mailbox requests (any op, owner, offset, length, address and segment id,
// biased towards the edges of what is valid), random bytes over the
// control blocks and command slots of the contexts it got attached,
// replayed and half-written requests, each followed by a ring; then it
// checks that the shim still serves a well-formed owner (its arena taken
// before the rounds, Attach and QueryPort after them). Run under ASan, the
// shim must neither crash nor hang.
//
// Prints what it saw, one line each; exits 0 when everything was as the
// protocol says, 3 when the shim refused it (closed the connection before
// the version), 1 on anything else.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "vrdma/abi.h"
#include "vrdma/ring.h"
#include "vrdma/vm_abi.h"
#include "vrdma_common/vm_mailbox.h"

namespace {

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "ivshmem-client: %s\n", what);
    std::exit(1);
}

// One message: 8 bytes, maybe an fd. False at end of stream.
bool receive(int sock, int64_t& value, int& fd) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    iovec iov{&value, sizeof(value)};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(sock, &m, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    if (n == 0) return false;
    if (n != sizeof(value)) die("a short or failed read of a message");
    fd = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof(fd));
    return true;
}

void ring(int bell) {
    const uint64_t one = 1;
    if (::write(bell, &one, sizeof(one)) != sizeof(one)) die("ringing the shim");
}

// One command on a context's ring, waited for (the shim may sleep: rung).
int command(vrdma::abi::ControlBlock* cb, uint32_t& seq, vrdma::abi::CmdOp op, const void* req, size_t len,
            void* resp, size_t resp_len, int bell) {
    using namespace vrdma::abi;
    const uint32_t prod = cb->cmd_producer.load();
    CmdSlot& slot = cb->cmd[vrdma::ring_slot(prod, kCmdSlots)];
    slot.op = op;
    std::memset(slot.req, 0, sizeof(slot.req));
    std::memcpy(slot.req, req, len);
    slot.seq.store(++seq, std::memory_order_release);
    cb->cmd_producer.store(vrdma::ring_next(prod, kCmdSlots), std::memory_order_release);
    cb->doorbell.fetch_add(1, std::memory_order_seq_cst);
    if (cb->shim_sleeping.load(std::memory_order_seq_cst)) ring(bell);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (slot.done_seq.load(std::memory_order_acquire) != seq) {
        if (std::chrono::steady_clock::now() > deadline) die("a command got no answer within 5 s");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::memcpy(resp, slot.resp, resp_len);
    return slot.status;
}

void play_agent(void* bar2, int bell, int contexts) {
    using namespace vrdma::abi;
    vrdma::VmMailboxClient mb(bar2, [bell] { ring(bell); });
    auto* page = static_cast<VmDevicePage*>(bar2);
    constexpr uint64_t kArena = 64 * 1024;
    std::vector<uint64_t> arenas;
    for (int c = 0; c < contexts; ++c) {
        const uint64_t owner = 100 + uint64_t(c);
        VmReply r{};
        if (int rc = mb.call(VmRequest{VmOp::Alloc, 0, owner, 0, kArena, 0}, r))
            die((std::string("Alloc refused: ") + r.message + " (" + std::strerror(rc) + ")").c_str());
        arenas.push_back(r.offset);
        // The process would map it at any address of its own.
        const uint64_t gva = 0x7f0000000000ull + uint64_t(c) * (1ull << 30);
        if (int rc = mb.call(VmRequest{VmOp::Attach, 0, owner, arenas.back(), kArena, gva}, r))
            die((std::string("Attach refused: ") + r.message + " (" + std::strerror(rc) + ")").c_str());
        if (r.lid != page->lid) die("Attach answered another LID");
    }
    for (int c = 0; c < contexts; ++c) {
        auto* cb = reinterpret_cast<ControlBlock*>(static_cast<uint8_t*>(bar2) + arenas[size_t(c)]);
        uint32_t seq = 0;
        CmdQueryPortReq q{1};
        PortAttr pa{};
        if (int st = command(cb, seq, CmdOp::QueryPort, &q, sizeof(q), &pa, sizeof(pa), bell))
            die((std::string("QueryPort failed: ") + std::strerror(st)).c_str());
        if (pa.lid != page->lid || pa.state != 4) die("QueryPort answered another LID, or a port not ACTIVE");
    }
    std::printf("contexts: %d attached, each QueryPort answered lid %u ACTIVE\n", contexts, page->lid);
    // What the mailbox refuses.
    VmReply r{};
    const int other = mb.call(VmRequest{VmOp::Free, 0, 999, arenas[0], 0, 0}, r);
    const int busy = mb.call(VmRequest{VmOp::Free, 0, 100, arenas[0], 0, 0}, r);
    const int twice = mb.call(VmRequest{VmOp::Attach, 0, 100, arenas[0], kArena, 0x1000}, r);
    const int huge = mb.call(VmRequest{VmOp::Alloc, 0, 100, 0, page->memory_bytes, 0}, r);
    const int odd = mb.call(VmRequest{VmOp::Alloc, 0, 100, 0, 100, 0}, r);
    const int zero = mb.call(VmRequest{VmOp::Alloc, 0, 0, 0, 4096, 0}, r);
    const int bad = mb.call(VmRequest{VmOp(77), 0, 100, 0, 0, 0}, r);
    std::printf("refused: another owner's region %s, an attached arena %s, a second attach %s, more than the "
                "memory %s, not pages %s, owner 0 %s, op 77 %s\n",
                strerrorname_np(other), strerrorname_np(busy), strerrorname_np(twice), strerrorname_np(huge),
                strerrorname_np(odd), strerrorname_np(zero), strerrorname_np(bad));
    for (int c = 0; c < contexts; ++c)
        if (mb.call(VmRequest{VmOp::Close, 0, 100 + uint64_t(c), 0, 0, 0}, r)) die("Close refused");
    // Everything is free again: one region as large as all the memory past
    // the mailbox fits.
    if (int rc = mb.call(VmRequest{VmOp::Alloc, 0, 5, 0, page->memory_bytes - kVmHeapOffset, 0}, r))
        die((std::string("after Close, the memory is not whole again: ") + std::strerror(rc)).c_str());
    std::printf("closed: every owner's context and regions freed, the memory whole again\n");
}

void play_hostile(void* bar2, int bell, int rounds) {
    using namespace vrdma::abi;
    vrdma::VmMailboxClient mb(bar2, [bell] { ring(bell); });
    auto* page = static_cast<VmDevicePage*>(bar2);
    auto* box = reinterpret_cast<VmMailbox*>(static_cast<uint8_t*>(bar2) + kVmMailboxOffset);
    const uint64_t mem = page->memory_bytes;
    std::mt19937_64 rng(uint64_t(::getpid()) * 0x9e3779b97f4a7c15ull);
    auto pick = [&](uint64_t n) { return n ? rng() % n : 0; };
    auto some_len = [&] {
        const uint64_t choices[] = {0, 1, 4096, 8192, 64 * 1024, mem, mem - kVmHeapOffset, mem + 4096, rng()};
        return choices[pick(std::size(choices))];
    };
    std::vector<uint64_t> arenas, regions;
    uint64_t requests = 0, scribbles = 0;
    // The well-formed owner that checks the shim still serves afterwards
    // takes its arena now. A scribbled request that a random sequence
    // number announces can carry any owner, one the test cannot name to
    // Close, and with a large length fill the memory for good.
    constexpr uint64_t kOwner = 424242, kArena = 64 * 1024;
    VmReply first{};
    if (mb.call(VmRequest{VmOp::Alloc, 0, kOwner, 0, kArena, 0}, first))
        die((std::string("hostile: the checking owner's Alloc failed: ") + first.message).c_str());
    const uint64_t arena = first.offset;
    // Three contexts to scribble over from the start (owners 1-3, which
    // the random requests then also Free, Detach, Close and reuse).
    for (uint64_t o = 1; o <= 3; ++o) {
        VmReply r{};
        if (mb.call(VmRequest{VmOp::Alloc, 0, o, 0, 64 * 1024, 0}, r)) die("hostile: the first Alloc failed");
        const uint64_t off = r.offset;
        if (mb.call(VmRequest{VmOp::Attach, 0, o, off, 64 * 1024, 0x7d0000000000ull + (o << 30)}, r))
            die("hostile: the first Attach failed");
        regions.push_back(off);
        arenas.push_back(off);
    }
    for (int i = 0; i < rounds; ++i) {
        switch (pick(5)) {
        case 0:
        case 1: {  // a random request, near what is valid
            VmRequest q{};
            q.op = VmOp(pick(9));
            q.owner = pick(4);
            q.seg_id = uint32_t(pick(4));
            q.offset = regions.empty() || pick(3) == 0 ? pick(mem + 8192) & ~uint64_t(pick(2) ? 4095 : 0)
                                                       : regions[pick(regions.size())] + 4096 * pick(3);
            q.len = some_len();
            q.gva = pick(2) ? 0x7f0000000000ull + 4096 * pick(1024) : rng();
            VmReply r{};
            const int rc = mb.call(q, r, 5000);
            if (rc == ETIMEDOUT || rc == ESHUTDOWN) die("the shim stopped answering the mailbox");
            if (rc == 0 && q.op == VmOp::Alloc) regions.push_back(r.offset);
            if (rc == 0 && q.op == VmOp::Attach) arenas.push_back(q.offset);
            ++requests;
            break;
        }
        case 2:  // random bytes over an attached context's control block
            if (!arenas.empty()) {
                auto* cb = static_cast<uint8_t*>(bar2) + arenas[pick(arenas.size())];
                for (int k = 0; k < 16; ++k) {
                    const uint64_t v = rng();
                    std::memcpy(cb + (pick(kControlBlockBytes / 8) * 8), &v, sizeof(v));
                }
                reinterpret_cast<ControlBlock*>(cb)->doorbell.fetch_add(1);
                ++scribbles;
            }
            ring(bell);
            break;
        case 3: {  // a half-written request, not announced
            const uint64_t v = rng();
            std::memcpy(reinterpret_cast<uint8_t*>(&box->request) + pick(sizeof(VmRequest) - 8), &v, sizeof(v));
            ring(bell);
            break;
        }
        default:  // the same request again (a replay), or a sequence number from nowhere
            box->request_seq.store(pick(2) ? box->reply_seq.load() : uint32_t(rng()));
            ring(bell);
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            break;
        }
    }
    // Whatever the sequence numbers were left at: a Ping first, so that no
    // announced request is still pending when the Attach (not idempotent)
    // goes in; then the well-formed owner attaches its arena, and a context
    // on it is served.
    VmReply r{};
    if (int rc = mb.call(VmRequest{VmOp::Ping, 0, 0, 0, 0, 0}, r))
        die((std::string("after the hostile rounds, Ping failed: ") + std::strerror(rc)).c_str());
    if (mb.call(VmRequest{VmOp::Attach, 0, kOwner, arena, kArena, 0x7e0000000000ull}, r))
        die((std::string("after the hostile rounds, Attach failed: ") + r.message).c_str());
    uint32_t seq = 0;
    CmdQueryPortReq q{1};
    PortAttr pa{};
    auto* cb = reinterpret_cast<ControlBlock*>(static_cast<uint8_t*>(bar2) + arena);
    if (command(cb, seq, CmdOp::QueryPort, &q, sizeof(q), &pa, sizeof(pa), bell) || pa.lid != page->lid)
        die("after the hostile rounds, QueryPort failed");
    std::printf("hostile: %d rounds (%llu random requests, %llu scribbled control blocks), the shim still serves\n",
                rounds, (unsigned long long)requests, (unsigned long long)scribbles);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) die("usage: vrdma-ivshmem-client SOCKET [--hold SECONDS] [--rings N]");
    int hold = 0, rings = 1, contexts = 0, hostile = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--hold")) hold = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--rings")) rings = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--contexts")) contexts = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--hostile")) hostile = std::atoi(argv[i + 1]);
        else die("unknown option");
    }
    int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", argv[1]);
    if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) die("cannot connect");

    int64_t v;
    int fd;
    if (!receive(sock, v, fd)) {
        std::printf("refused\n");
        return 3;
    }
    if (v != 0 || fd >= 0) die("the first message is not protocol version 0");
    int64_t id;
    if (!receive(sock, id, fd) || fd >= 0 || id < 0 || id > 65535) die("the second message is not the VM's ID");
    int shm = -1;
    if (!receive(sock, v, shm) || v != -1 || shm < 0) die("the third message is not -1 with the memory");
    // Then the shim's vectors (to ring it), then the VM's own.
    std::vector<int> shim_bells, own_bells;
    while (shim_bells.size() + own_bells.size() < 2 * vrdma::abi::kVmVectors) {
        if (!receive(sock, v, fd) || fd < 0) die("fewer eventfds than 2 x kVmVectors");
        if (v == id) own_bells.push_back(fd);
        else if (v == vrdma::abi::kVmShimPeer && own_bells.empty()) shim_bells.push_back(fd);
        else die("an eventfd for an unexpected peer, or out of order");
    }
    std::printf("protocol: version 0, vm id %lld, memory fd, %zu shim vectors, %zu own vectors\n", (long long)id,
                shim_bells.size(), own_bells.size());

    struct stat st{};
    if (::fstat(shm, &st) != 0) die("fstat of the memory");
    if (::ftruncate(shm, st.st_size / 2) == 0) die("the memory can be shrunk: it is not sealed");
    void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    if (p == MAP_FAILED) die("mmap of the memory");
    auto* page = static_cast<vrdma::abi::VmDevicePage*>(p);
    if (page->magic != vrdma::abi::kVmMagic || page->version != vrdma::abi::kVmVersion ||
        page->memory_bytes != uint64_t(st.st_size) || page->vm_peer != uint32_t(id))
        die("the device page is not the shim's");
    std::printf("device: guest %.64s lid %u memory %llu MiB state %u kicks %llu\n", page->guest_name, page->lid,
                (unsigned long long)(page->memory_bytes >> 20), page->shim_state.load(),
                (unsigned long long)page->kicks.load());

    const uint64_t before = page->kicks.load();
    for (int r = 0; r < rings; ++r) {
        const uint64_t one = 1;
        if (::write(shim_bells[vrdma::abi::kVmVectorKick], &one, sizeof(one)) != sizeof(one)) die("ringing the shim");
        // One at a time: the shim may take several rings in one read.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (page->kicks.load() < before + uint64_t(r) + 1) {
            if (std::chrono::steady_clock::now() > deadline) die("the shim did not count the ring within 5 s");
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    std::printf("rings: %d, the shim counted %llu\n", rings, (unsigned long long)(page->kicks.load() - before));
    if (contexts) play_agent(p, shim_bells[vrdma::abi::kVmVectorKick], contexts);
    if (hostile) play_hostile(p, shim_bells[vrdma::abi::kVmVectorKick], hostile);
    std::fflush(stdout);
    if (hold) std::this_thread::sleep_for(std::chrono::seconds(hold));
    return 0;
}
