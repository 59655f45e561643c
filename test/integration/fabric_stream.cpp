// vrdma-fabric-stream: an RC stream through the real libibverbs, for the
// fabric fault tests (test/integration/fabric/*.sh). Unlike the pingpong
// examples it lets the test set the QP's local ACK timeout and retry count,
// checks every byte it moves and names the status of a failed completion.
//
//   server:  vrdma-fabric-stream [OPTIONS]
//   client:  vrdma-fabric-stream [OPTIONS] SERVER_ADDRESS
//
// The two exchange LID, QPN, PSN, buffer address and rkey over TCP (like
// ibv_rc_pingpong), then the client streams messages: message i is an RDMA
// WRITE of SIZE bytes into slot i % WINDOW of the server's buffer followed by
// a SEND of SIZE bytes with immediate data i. Both carry a pattern that
// depends on i and the byte's offset. On each receive the server checks the
// send's payload and the slot the write filled, every byte, reposts the
// receive and returns a credit (a zero-byte SEND with immediate i); the
// client never has more than WINDOW messages without credit (and while it
// waits for credits it keeps an 8-byte probe write outstanding, see
// next_completion). A last SEND
// with immediate 0xffffffff ends the stream; the server answers it and both
// exit 0.
//
// Output (stdout, line-buffered):
//   progress N                  every 0.5 s: messages credited so far
//   client: done N messages, B bytes verified by the server, X MB/s
//   server: verified N messages, B bytes
// On the first failed completion, on either side (the first one that is not
// a flush, IBV_WC_WR_FLUSH_ERR, if one comes within 0.5 s):
//   client: completion error IBV_WC_RETRY_EXC_ERR (opcode SEND, wr_id 7)
//       after 1.234 s without progress; 4 flushed
// and exit status 1. A data mismatch: "server: data mismatch ..." and 2.
// Setup failures: 3.
//
// Options:
//   -d DEV      device (default vrdma0)       -p PORT   TCP port (18600)
//   -s SIZE     message size (65536)          -w N      window (4)
//   -n COUNT    messages (1000)               -S SECS   stream for SECS
//                                                       seconds instead of -n
//   -t TIMEOUT  local ACK timeout, 4.096 us x 2^TIMEOUT (14)
//   -r RETRY    retry_cnt (7)                 -q        no progress lines
// VRDMA_STREAM_DEBUG=1 in the environment prints every completion polled
// after the first failed one.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <endian.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kDone = 0xffffffffu;
// The probe: an 8-byte RDMA WRITE into the last bytes of the server's buffer.
constexpr size_t kProbeBytes = 64;
constexpr uint64_t kProbeId = ~0ull - 1;
constexpr auto kProbeAfter = std::chrono::milliseconds(20);

struct Options {
    std::string device = "vrdma0";
    std::string server;  // empty: this is the server
    int port = 18600;
    size_t size = 65536;
    uint32_t window = 4;
    uint64_t count = 1000;
    double seconds = 0;
    int timeout = 14;
    int retry = 7;
    bool progress = true;
};

// What the two sides exchange over TCP, in network byte order.
struct Wire {
    uint32_t lid, qpn, psn, rkey;
    uint64_t addr;
    uint64_t size;
    uint32_t window;
    uint32_t pad;
};

const char* role = "client";

const char* status_name(ibv_wc_status s) {
    switch (s) {
#define N(x) \
    case x: return #x;
        N(IBV_WC_SUCCESS) N(IBV_WC_LOC_LEN_ERR) N(IBV_WC_LOC_QP_OP_ERR) N(IBV_WC_LOC_EEC_OP_ERR)
        N(IBV_WC_LOC_PROT_ERR) N(IBV_WC_WR_FLUSH_ERR) N(IBV_WC_MW_BIND_ERR) N(IBV_WC_BAD_RESP_ERR)
        N(IBV_WC_LOC_ACCESS_ERR) N(IBV_WC_REM_INV_REQ_ERR) N(IBV_WC_REM_ACCESS_ERR) N(IBV_WC_REM_OP_ERR)
        N(IBV_WC_RETRY_EXC_ERR) N(IBV_WC_RNR_RETRY_EXC_ERR) N(IBV_WC_LOC_RDD_VIOL_ERR)
        N(IBV_WC_REM_INV_RD_REQ_ERR) N(IBV_WC_REM_ABORT_ERR) N(IBV_WC_INV_EECN_ERR)
        N(IBV_WC_INV_EEC_STATE_ERR) N(IBV_WC_FATAL_ERR) N(IBV_WC_RESP_TIMEOUT_ERR) N(IBV_WC_GENERAL_ERR)
        N(IBV_WC_TM_ERR) N(IBV_WC_TM_RNDV_INCOMPLETE)
#undef N
    }
    return "IBV_WC_UNKNOWN";
}

const char* opcode_name(ibv_wc_opcode op) {
    switch (op) {
    case IBV_WC_SEND: return "SEND";
    case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WC_RDMA_READ: return "RDMA_READ";
    case IBV_WC_RECV: return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
    default: return "OTHER";
    }
}

[[noreturn]] void die(const char* what) {
    fprintf(stdout, "%s: %s: %s\n", role, what, errno ? strerror(errno) : "failed");
    exit(3);
}

// The byte at OFFSET of message I, KIND 0 for the write, 1 for the send: a
// different sequence for every message, offset and kind.
inline uint8_t pattern(uint64_t i, size_t offset, unsigned kind) {
    uint64_t x = (i * 0x9e3779b97f4a7c15ull) ^ (uint64_t(offset >> 3) * 0xbf58476d1ce4e5b9ull) ^ kind;
    x ^= x >> 29;
    return uint8_t(x >> ((offset & 7) * 8));
}

void fill(uint8_t* p, uint64_t i, size_t size, unsigned kind) {
    for (size_t o = 0; o < size; ++o) p[o] = pattern(i, o, kind);
}

// The offset of the first wrong byte, or SIZE.
size_t check(const uint8_t* p, uint64_t i, size_t size, unsigned kind) {
    for (size_t o = 0; o < size; ++o)
        if (p[o] != pattern(i, o, kind)) return o;
    return size;
}

bool full_io(int fd, void* buf, size_t n, bool write_it) {
    auto* p = static_cast<char*>(buf);
    while (n > 0) {
        ssize_t r = write_it ? ::write(fd, p, n) : ::read(fd, p, n);
        if (r <= 0) return false;
        p += r;
        n -= size_t(r);
    }
    return true;
}

// The TCP exchange: the server listens, the client connects (retrying for
// 10 s while the server starts).
Wire exchange(const Options& o, const Wire& mine) {
    int fd = -1;
    if (o.server.empty()) {
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(uint16_t(o.port));
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) || listen(ls, 1)) die("listen");
        fd = accept(ls, nullptr, nullptr);
        close(ls);
        if (fd < 0) die("accept");
    } else {
        addrinfo hints{};
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* res = nullptr;
        if (getaddrinfo(o.server.c_str(), std::to_string(o.port).c_str(), &hints, &res) || !res)
            die("cannot resolve the server");
        auto until = Clock::now() + std::chrono::seconds(10);
        while (true) {
            fd = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
            close(fd);
            if (Clock::now() > until) die("connect");
            usleep(50000);
        }
        freeaddrinfo(res);
    }
    Wire theirs{};
    if (!full_io(fd, const_cast<Wire*>(&mine), sizeof(mine), true) || !full_io(fd, &theirs, sizeof(theirs), false))
        die("connection data exchange");
    close(fd);
    return theirs;
}

Wire to_net(Wire w) {
    w.lid = htonl(w.lid);
    w.qpn = htonl(w.qpn);
    w.psn = htonl(w.psn);
    w.rkey = htonl(w.rkey);
    w.window = htonl(w.window);
    w.addr = htobe64(w.addr);
    w.size = htobe64(w.size);
    return w;
}
Wire from_net(Wire w) { return to_net(w); }  // the same swaps

struct Rdma {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_mr* mr = nullptr;
    uint8_t* buf = nullptr;
    size_t buf_size = 0;
    ibv_port_attr port{};
};

void open_rdma(const Options& o, Rdma& r) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) die("ibv_get_device_list");
    for (int i = 0; i < n && !r.ctx; ++i)
        if (o.device == ibv_get_device_name(list[i])) r.ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!r.ctx) die(("no device " + o.device).c_str());
    if (ibv_query_port(r.ctx, 1, &r.port)) die("ibv_query_port");
    r.pd = ibv_alloc_pd(r.ctx);
    if (!r.pd) die("ibv_alloc_pd");
    // Server: WINDOW write slots, then WINDOW receive slots. Client: WINDOW
    // write sources, then WINDOW send sources.
    r.buf_size = 2 * size_t(o.window) * o.size + kProbeBytes;
    r.buf = static_cast<uint8_t*>(aligned_alloc(4096, (r.buf_size + 4095) / 4096 * 4096));
    if (!r.buf) die("aligned_alloc");
    memset(r.buf, 0, r.buf_size);
    r.mr = ibv_reg_mr(r.pd, r.buf, r.buf_size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!r.mr) die("ibv_reg_mr");
    int depth = int(2 * o.window + 4);
    r.cq = ibv_create_cq(r.ctx, 2 * depth, nullptr, nullptr, 0);
    if (!r.cq) die("ibv_create_cq");
    ibv_qp_init_attr init{};
    init.send_cq = r.cq;
    init.recv_cq = r.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = uint32_t(depth);
    init.cap.max_recv_wr = uint32_t(depth);
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    r.qp = ibv_create_qp(r.pd, &init);
    if (!r.qp) die("ibv_create_qp");
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(r.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("ibv_modify_qp INIT");
}

void connect_qp(const Options& o, Rdma& r, const Wire& local, const Wire& remote) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = r.port.active_mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = uint16_t(remote.lid);
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(r.qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("ibv_modify_qp RTR");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = uint8_t(o.timeout);
    a.retry_cnt = uint8_t(o.retry);
    a.rnr_retry = 7;
    a.sq_psn = local.psn;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(r.qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC))
        die("ibv_modify_qp RTS");
}

void post_recv(Rdma& r, uint64_t wr_id, void* addr, size_t len) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(addr), uint32_t(len), r.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = len ? &sge : nullptr;
    wr.num_sge = len ? 1 : 0;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(r.qp, &wr, &bad)) die("ibv_post_recv");
}

void post_send(Rdma& r, uint64_t wr_id, ibv_wr_opcode op, void* addr, size_t len, uint32_t imm,
               uint64_t remote_addr = 0, uint32_t rkey = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(addr), uint32_t(len), r.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = len ? &sge : nullptr;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(r.qp, &wr, &bad)) die("ibv_post_send");
}

// Polls one completion; spins briefly, then yields, then naps (2 cores are
// shared by shims and clients). A failed completion ends the program.
// With UNTIL set, gives up then and returns false.
Clock::time_point last_progress = Clock::now();
bool poll_one(Rdma& r, ibv_wc& wc, const Clock::time_point* until = nullptr) {
    wc = {};
    unsigned empty = 0;
    while (true) {
        int n = ibv_poll_cq(r.cq, 1, &wc);
        if (n < 0) die("ibv_poll_cq");
        if (n == 1) break;
        if (++empty > 2000) usleep(100);
        else if (empty > 64) sched_yield();
        if (until && (empty & 63) == 0 && Clock::now() >= *until) return false;
    }
    if (wc.status != IBV_WC_SUCCESS) {
        double idle = std::chrono::duration<double>(Clock::now() - last_progress).count();
        // Sends and receives share the CQ: when the QP fails, its receives
        // are flushed (IBV_WC_WR_FLUSH_ERR) in no particular order with the
        // send that failed. Report the cause: the first error that is not a
        // flush, looking up to 0.5 s further.
        unsigned flushed = 0;
        auto until = Clock::now() + std::chrono::milliseconds(500);
        while (wc.status == IBV_WC_WR_FLUSH_ERR && Clock::now() < until) {
            ++flushed;
            ibv_wc next{};
            int n = 0;
            while ((n = ibv_poll_cq(r.cq, 1, &next)) == 0 && Clock::now() < until) usleep(1000);
            if (n <= 0) break;
            if (getenv("VRDMA_STREAM_DEBUG"))
                fprintf(stdout, "  then %s opcode %s wr_id %llu\n", status_name(next.status), opcode_name(next.opcode),
                        static_cast<unsigned long long>(next.wr_id));
            if (next.status != IBV_WC_SUCCESS) wc = next;
        }
        fprintf(stdout, "%s: completion error %s (opcode %s, wr_id %llu) after %.3f s without progress; %u flushed\n",
                role, status_name(wc.status), opcode_name(wc.opcode), static_cast<unsigned long long>(wc.wr_id), idle,
                flushed);
        exit(1);
    }
    last_progress = Clock::now();
    return true;
}
ibv_wc poll_one(Rdma& r) {
    ibv_wc wc;
    poll_one(r, wc);
    return wc;
}

int run_server(const Options& o, Rdma& r, const Wire& remote) {
    const size_t size = o.size;
    uint8_t* wslots = r.buf;
    uint8_t* rslots = r.buf + size_t(o.window) * size;
    uint64_t expect = 0, bytes = 0;
    uint8_t credit = 0;
    (void)remote;
    while (true) {
        ibv_wc wc = poll_one(r);
        if (wc.opcode != IBV_WC_RECV) continue;  // a credit went out
        if (!(wc.wc_flags & IBV_WC_WITH_IMM)) {
            fprintf(stdout, "server: a receive without immediate data\n");
            return 2;
        }
        uint32_t imm = ntohl(wc.imm_data);
        uint32_t slot = uint32_t(wc.wr_id);
        if (imm == kDone) {
            post_send(r, 1ull << 32, IBV_WR_SEND_WITH_IMM, &credit, 0, kDone);
            // The answer must leave before the QP goes away.
            while (poll_one(r).wr_id != (1ull << 32)) {
            }
            fprintf(stdout, "server: verified %llu messages, %llu bytes\n", static_cast<unsigned long long>(expect),
                    static_cast<unsigned long long>(bytes));
            return 0;
        }
        if (imm != uint32_t(expect) || slot != expect % o.window || wc.byte_len != size) {
            fprintf(stdout, "server: message %u (slot %u, %u bytes) arrived where %llu (slot %llu, %zu bytes) was due\n",
                    imm, slot, wc.byte_len, static_cast<unsigned long long>(expect),
                    static_cast<unsigned long long>(expect % o.window), size);
            return 2;
        }
        // The send's payload (kind 1), then the slot the write filled (kind 0).
        for (unsigned kind : {1u, 0u}) {
            const uint8_t* p = (kind ? rslots : wslots) + slot * size;
            size_t off = check(p, expect, size, kind);
            if (off == size) continue;
            fprintf(stdout, "server: data mismatch in message %llu (%s) at byte %zu: got 0x%02x, want 0x%02x\n",
                    static_cast<unsigned long long>(expect), kind ? "send" : "rdma write", off, p[off],
                    pattern(expect, off, kind));
            return 2;
        }
        bytes += 2 * size;
        memset(rslots + slot * size, 0, size);
        memset(wslots + slot * size, 0, size);
        post_recv(r, slot, rslots + slot * size, size);
        post_send(r, 1ull << 32, IBV_WR_SEND_WITH_IMM, &credit, 0, imm);
        ++expect;
    }
}

// The client's next completion. A QP with nothing outstanding never learns
// that its peer is gone (on InfiniBand as here), and the client waits for
// credits with an empty send queue; so once the send queue has been empty
// for 20 ms, the client posts a probe (an 8-byte RDMA WRITE to the server's
// probe area), as an application's heartbeat would: a dead peer then shows
// as the QP's own retry error. Returns false when it posted a probe.
bool next_completion(const Options& o, Rdma& r, const Wire& remote, uint64_t& posted, uint64_t done, ibv_wc& wc) {
    if (posted != done) return poll_one(r, wc);
    Clock::time_point until = Clock::now() + kProbeAfter;
    if (poll_one(r, wc, &until)) return true;
    uint8_t* src = r.buf + 2 * size_t(o.window) * o.size;
    post_send(r, kProbeId, IBV_WR_RDMA_WRITE, src, 8, 0, remote.addr + 2 * size_t(o.window) * o.size, remote.rkey);
    ++posted;
    return false;
}

int run_client(const Options& o, Rdma& r, const Wire& remote) {
    const size_t size = o.size;
    uint8_t* wsrc = r.buf;
    uint8_t* ssrc = r.buf + size_t(o.window) * size;
    const auto t0 = Clock::now();
    auto next_report = t0 + std::chrono::milliseconds(500);
    uint64_t sent = 0, credited = 0;
    uint64_t sends_posted = 0, sends_done = 0;  // send queue occupancy
    const uint64_t sq_room = 2 * uint64_t(o.window) + 2;
    bool stop = false;
    auto time_up = [&] {
        if (o.seconds > 0) return std::chrono::duration<double>(Clock::now() - t0).count() >= o.seconds;
        return sent >= o.count;
    };
    while (true) {
        while (!stop && sent - credited < o.window && sends_posted - sends_done + 2 <= sq_room) {
            if (time_up()) {
                stop = true;
                break;
            }
            uint32_t slot = uint32_t(sent % o.window);
            fill(wsrc + slot * size, sent, size, 0);
            fill(ssrc + slot * size, sent, size, 1);
            post_send(r, sent * 2, IBV_WR_RDMA_WRITE, wsrc + slot * size, size, 0, remote.addr + slot * size,
                      remote.rkey);
            post_send(r, sent * 2 + 1, IBV_WR_SEND_WITH_IMM, ssrc + slot * size, size, uint32_t(sent));
            sends_posted += 2;
            ++sent;
        }
        if (stop && credited == sent && sends_done == sends_posted) break;
        ibv_wc wc;
        if (!next_completion(o, r, remote, sends_posted, sends_done, wc)) continue;
        if (wc.opcode == IBV_WC_RECV) {
            uint32_t imm = ntohl(wc.imm_data);
            if (imm != uint32_t(credited)) {
                fprintf(stdout, "client: credit for message %u where %llu was due\n", imm,
                        static_cast<unsigned long long>(credited));
                return 2;
            }
            ++credited;
            post_recv(r, 0, nullptr, 0);
        } else {
            ++sends_done;
        }
        if (o.progress && Clock::now() >= next_report) {
            fprintf(stdout, "progress %llu\n", static_cast<unsigned long long>(credited));
            next_report += std::chrono::milliseconds(500);
        }
    }
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    post_send(r, ~0ull, IBV_WR_SEND_WITH_IMM, ssrc, 0, kDone);
    ++sends_posted;
    while (true) {
        ibv_wc wc;
        if (!next_completion(o, r, remote, sends_posted, sends_done, wc)) continue;
        if (wc.opcode == IBV_WC_RECV && ntohl(wc.imm_data) == kDone) break;
        if (wc.opcode != IBV_WC_RECV) ++sends_done;
    }
    fprintf(stdout, "client: done %llu messages, %llu bytes verified by the server, %.1f MB/s\n",
            static_cast<unsigned long long>(sent), static_cast<unsigned long long>(2 * sent * size),
            double(2 * sent * size) / secs / 1e6);
    return 0;
}

bool parse(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
        const char* v = nullptr;
        if (a == "-q") {
            o.progress = false;
            continue;
        }
        if (a.size() == 2 && a[0] == '-' && !(v = val())) return false;
        if (a == "-d") o.device = v;
        else if (a == "-p") o.port = atoi(v);
        else if (a == "-s") o.size = strtoull(v, nullptr, 0);
        else if (a == "-w") o.window = uint32_t(strtoul(v, nullptr, 0));
        else if (a == "-n") o.count = strtoull(v, nullptr, 0);
        else if (a == "-S") o.seconds = atof(v);
        else if (a == "-t") o.timeout = atoi(v);
        else if (a == "-r") o.retry = atoi(v);
        else if (a[0] != '-' && o.server.empty()) o.server = a;
        else return false;
    }
    return o.size > 0 && o.size <= (1u << 30) && o.window > 0 && o.window <= 64 && o.timeout >= 0 &&
           o.timeout <= 31 && o.retry >= 0 && o.retry <= 7;
}

}  // namespace

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    Options o;
    if (!parse(argc, argv, o)) {
        fprintf(stderr,
                "usage: vrdma-fabric-stream [-d DEV] [-p PORT] [-s SIZE] [-w WINDOW] [-n COUNT | -S SECONDS]\n"
                "                           [-t TIMEOUT] [-r RETRY] [-q] [SERVER_ADDRESS]\n");
        return 64;
    }
    role = o.server.empty() ? "server" : "client";
    Rdma r;
    open_rdma(o, r);
    Wire local{};
    local.lid = r.port.lid;
    local.qpn = r.qp->qp_num;
    srand48(getpid() ^ time(nullptr));
    local.psn = uint32_t(lrand48()) & 0xffffff;
    local.rkey = r.mr->rkey;
    local.addr = reinterpret_cast<uintptr_t>(r.buf);
    local.size = o.size;
    local.window = o.window;
    // Receives before the peer can send: the server's slots, the client's
    // credits.
    for (uint32_t s = 0; s < o.window; ++s) {
        if (o.server.empty()) post_recv(r, s, r.buf + size_t(o.window + s) * o.size, o.size);
        else post_recv(r, 0, nullptr, 0);
    }
    if (!o.server.empty()) post_recv(r, 0, nullptr, 0);  // for the end's answer
    Wire remote = from_net(exchange(o, to_net(local)));
    if (remote.size != o.size || remote.window != o.window) {
        fprintf(stdout, "%s: the peer uses -s %llu -w %u, this side -s %zu -w %u\n", role,
                static_cast<unsigned long long>(remote.size), remote.window, o.size, o.window);
        return 3;
    }
    connect_qp(o, r, local, remote);
    fprintf(stdout, "%s: connected: local lid %u qpn 0x%06x, remote lid %u qpn 0x%06x; timeout %d retry_cnt %d\n", role,
            local.lid, local.qpn, remote.lid, remote.qpn, o.timeout, o.retry);
    last_progress = Clock::now();
    int rc = o.server.empty() ? run_server(o, r, remote) : run_client(o, r, remote);
    ibv_destroy_qp(r.qp);
    ibv_destroy_cq(r.cq);
    ibv_dereg_mr(r.mr);
    ibv_dealloc_pd(r.pd);
    ibv_close_device(r.ctx);
    free(r.buf);
    return rc;
}
