// Helpers for the verbs semantics tests: the real libibverbs on the vrdma
// devices of the guests this program runs in (through vrdma-run).
//
// Tests that connect two QPs put the "local" end on Device (vrdma0) and the
// "remote" end on a peer Device (vrdma1): under `vrdma-run --guest a --guest
// b` those are two guests, possibly served by two shims on two hosts, so
// every connection crosses between guests. With one guest (no vrdma1) the
// peer is a second context of vrdma0, and the same tests run within a guest.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vt {

// One opened device with a PD; everything else is created per test.
struct Device {
    enum Role { kLocal, kPeer };
    // kLocal opens vrdma0; kPeer opens vrdma1 when it exists, else vrdma0.
    explicit Device(Role role = kLocal);
    ~Device();
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    uint16_t lid = 0;
    std::string name;
};

// The name of the device a peer Device opens ("vrdma1" or "vrdma0").
std::string peer_device_name();

// Whether the guests' traffic goes through Soft-RoCE (scripts/test-hca.sh
// sets VRDMA_TEST_THROUGH_RXE=1 for its run of this suite): where the device
// is the responder, its behaviour is the one a test may see.
bool through_rxe();

// A registered buffer.
struct Buffer {
    Buffer(ibv_pd* pd, size_t size, int access);
    ~Buffer();
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    uint8_t* data = nullptr;
    size_t size = 0;
    ibv_mr* mr = nullptr;
    uint64_t addr(size_t off = 0) const { return reinterpret_cast<uint64_t>(data + off); }
};

struct QpOptions {
    ibv_qp_type type = IBV_QPT_RC;
    uint32_t max_send_wr = 64;
    uint32_t max_recv_wr = 64;
    uint32_t max_sge = 4;
    uint32_t max_inline = 64;
    ibv_srq* srq = nullptr;
    int sq_sig_all = 0;
    // CQs the caller made and keeps (e.g. extended CQs); null: the Qp makes its own.
    ibv_cq* send_cq = nullptr;
    ibv_cq* recv_cq = nullptr;
};

struct Qp {
    Qp(Device& dev, const QpOptions& opt = {});
    ~Qp();
    Qp(const Qp&) = delete;
    Qp& operator=(const Qp&) = delete;

    ibv_cq* send_cq = nullptr;
    ibv_cq* recv_cq = nullptr;
    ibv_qp* qp = nullptr;
    bool owns_cqs = true;
    uint32_t qpn() const { return qp->qp_num; }
};

struct RcParams {
    int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    uint8_t rnr_retry = 7;
    uint8_t min_rnr_timer = 1;  // 0.01 ms
    // What ibv_rc_pingpong uses. Across hosts (TCP between shims, two
    // cores shared by two shims and the test's threads) an ACK can take
    // longer than a millisecond; only the test about a peer that never
    // answers wants a short timeout, and sets it.
    uint8_t retry_cnt = 7;
    uint8_t timeout = 14;       // 67 ms
};

// RESET -> INIT -> RTR -> RTS towards (lid, remote_qpn).
void connect_rc(ibv_qp* qp, uint16_t lid, uint32_t remote_qpn, const RcParams& p = {});
// UC: the three steps (uc_init grants `access` to the peer), and all of them.
void uc_init(ibv_qp* qp, int access = IBV_ACCESS_REMOTE_WRITE);
void uc_rtr(ibv_qp* qp, uint16_t lid, uint32_t remote_qpn);
void uc_rts(ibv_qp* qp);
void connect_uc(ibv_qp* qp, uint16_t lid, uint32_t remote_qpn);
void bring_up_ud(ibv_qp* qp, uint32_t qkey);
ibv_qp_state qp_state(ibv_qp* qp);

// Waits up to timeout_ms for one completion.
std::optional<ibv_wc> poll_one(ibv_cq* cq, int timeout_ms = 2000);
// Expects no completion within ms milliseconds.
bool cq_stays_empty(ibv_cq* cq, int ms);

// A connected RC pair: a on `d`, b on `peer` (QPs and CQs its own).
struct RcPair {
    RcPair(Device& d, Device& peer, RcParams pa = {}, RcParams pb = {}, QpOptions o = {})
        : dev(d), a(d, o), b(peer, o) {
        connect_rc(a.qp, peer.lid, b.qpn(), pa);
        connect_rc(b.qp, d.lid, a.qpn(), pb);
    }
    Device& dev;
    Qp a, b;
};

// `n` bytes of a pattern that differs with `seed` and along the buffer, and
// whether [p, p+n) holds it.
void pattern(uint8_t* p, size_t n, uint8_t seed);
bool has_pattern(const uint8_t* p, size_t n, uint8_t seed);
// The status of the next completion on `cq` within 5 s (0xffff: none came).
uint32_t complete(ibv_cq* cq);
// The peer's (b's) RDMA `op` (READ or WRITE) of `len` bytes at `remote`
// through `rkey`, into or out of `other`: its completion status.
uint32_t peer_rdma(RcPair& p, ibv_wr_opcode op, uint64_t remote, uint32_t rkey, Buffer& other, size_t len);

int post_recv(ibv_qp* qp, uint64_t wr_id, std::vector<ibv_sge> sges);
int post_send(ibv_qp* qp, ibv_send_wr wr, std::vector<ibv_sge> sges);
ibv_sge sge(const Buffer& b, size_t off, uint32_t len);

}  // namespace vt
