// Handle tables and the segment table of the shim.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <unordered_map>

#include "flat_map.h"
#include "handle_table.h"
#include "qp_state.h"
#include "segment_table.h"

using namespace vrdma::shim;

namespace {
struct Obj {
    int v;
};
using Table = HandleTable<Obj, HandleType::Pd>;
using OtherTable = HandleTable<Obj, HandleType::Cq>;
}  // namespace

TEST_CASE("handles are nonzero, typed and generation-checked", "[shim][handles]") {
    Table t(4);
    uint32_t h1 = t.insert(std::make_unique<Obj>(Obj{1}));
    uint32_t h2 = t.insert(std::make_unique<Obj>(Obj{2}));
    REQUIRE(h1 != 0);
    REQUIRE(h2 != 0);
    CHECK(h1 != h2);
    CHECK(t.get(h1)->v == 1);
    CHECK(t.get(0) == nullptr);
    CHECK(t.get(0xffffffff) == nullptr);
    CHECK(t.get(h1 + 100) == nullptr);  // slot out of range

    // The same slot index in a table of another type does not match.
    OtherTable o(4);
    uint32_t oh = o.insert(std::make_unique<Obj>(Obj{3}));
    CHECK((oh & kHandleMaxSlots) == (h1 & kHandleMaxSlots));
    CHECK(t.get(oh) == nullptr);
    CHECK(o.get(h1) == nullptr);

    // Freed handles stay dead even after their slot is reused.
    REQUIRE(t.erase(h1));
    CHECK(t.get(h1) == nullptr);
    CHECK(t.erase(h1) == nullptr);
    uint32_t h3 = t.insert(std::make_unique<Obj>(Obj{4}));
    uint32_t h4 = t.insert(std::make_unique<Obj>(Obj{5}));
    CHECK(t.get(h1) == nullptr);
    CHECK(h3 != h1);
    CHECK(h4 != h1);
    CHECK(t.size() == 3);
}

TEST_CASE("handle tables enforce their limit", "[shim][handles]") {
    Table t(2);
    CHECK(t.insert(std::make_unique<Obj>()) != 0);
    uint32_t h = t.insert(std::make_unique<Obj>());
    CHECK(h != 0);
    CHECK(t.insert(std::make_unique<Obj>()) == 0);
    t.erase(h);
    CHECK(t.insert(std::make_unique<Obj>()) != 0);
}

namespace {

struct Memfd {
    int fd;
    explicit Memfd(size_t len) {
        fd = memfd_create("seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        REQUIRE(ftruncate(fd, off_t(len)) == 0);
        REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
    }
    ~Memfd() { close(fd); }
    vrdma::UniqueFd dup() const { return vrdma::UniqueFd(::dup(fd)); }
};

}  // namespace

TEST_CASE("map_segment validates its arguments", "[shim][segments]") {
    Memfd m(16 * 4096);
    std::shared_ptr<Mapping> map;
    CHECK(map_segment(m.dup(), 0x100000, 4096, 0, map) == 0);
    CHECK(map_segment(m.dup(), 0x100001, 4096, 0, map) == EINVAL);      // unaligned gva
    CHECK(map_segment(m.dup(), 0x100000, 100, 0, map) == EINVAL);       // not a page multiple
    CHECK(map_segment(m.dup(), 0x100000, 4096, 5, map) == EINVAL);      // unaligned offset
    CHECK(map_segment(m.dup(), 0x100000, 32 * 4096, 0, map) == EINVAL); // beyond the file
    CHECK(map_segment(m.dup(), 0x100000, 4096, 16 * 4096, map) == EINVAL);
    CHECK(map_segment(m.dup(), 0xfffffffffffff000ull, 8192, 0, map) == EINVAL);  // wraps
    CHECK(map_segment(m.dup(), 0x100000, 0, 0, map) == EINVAL);
    CHECK(map_segment(vrdma::UniqueFd(), 0x100000, 4096, 0, map) == EBADF);
    // Not a memfd: a pipe.
    int p[2];
    REQUIRE(pipe(p) == 0);
    close(p[1]);
    CHECK(map_segment(vrdma::UniqueFd(p[0]), 0x100000, 4096, 0, map) != 0);
    // The shim sealed the memfd against shrinking.
    CHECK(ftruncate(m.fd, 4096) != 0);
}

TEST_CASE("segment lookups, overlap and composed MR mappings", "[shim][segments]") {
    Memfd m1(8 * 4096), m2(8 * 4096);
    std::shared_ptr<Mapping> s1, s2;
    const uint64_t base = 0x40000000;
    REQUIRE(map_segment(m1.dup(), base, 8 * 4096, 0, s1) == 0);
    REQUIRE(map_segment(m2.dup(), base + 6 * 4096, 4 * 4096, 4096, s2) == 0);  // overlaps 2 pages of s1
    SegmentTable t;
    REQUIRE(t.insert(1, s1) == 0);
    CHECK(t.insert(1, s1) == EEXIST);
    REQUIRE(t.insert(2, s2) == 0);
    CHECK(t.has(1));
    CHECK(t.has(2));

    // Write distinct content through the guest's own view of each memfd.
    auto* v1 = static_cast<uint8_t*>(mmap(nullptr, 8 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, m1.fd, 0));
    auto* v2 = static_cast<uint8_t*>(mmap(nullptr, 8 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, m2.fd, 0));
    std::memset(v1, 'a', 8 * 4096);
    std::memset(v2, 'b', 8 * 4096);

    // Lookups inside one piece.
    CHECK(t.find_within_one(base, 6 * 4096) != nullptr);
    CHECK(t.find_within_one(base, 6 * 4096 + 1) == nullptr);  // crosses into s2
    CHECK(t.find_within_one(base + 6 * 4096, 4 * 4096) != nullptr);
    CHECK(t.find_within_one(base + 10 * 4096, 1) == nullptr);  // past the end
    CHECK(t.find_within_one(base - 1, 2) == nullptr);
    CHECK(t.find_within_one(base, UINT64_MAX) == nullptr);

    // The overlapped pages now read from s2 (offset 4096 of m2).
    HostRange r;
    REQUIRE(t.translate_one(base + 6 * 4096, 16, r) == 0);
    CHECK(r.host[0] == 'b');
    // A range across both is composed into one contiguous mapping.
    REQUIRE(t.map_range(base + 5 * 4096 + 100, 2 * 4096, r) == 0);
    CHECK(r.host[0] == 'a');
    CHECK(r.host[4096 - 100] == 'b');
    v2[4096] = 'X';  // first byte of s2's range
    CHECK(r.host[4096 - 100] == 'X');  // shared, not copied
    CHECK(t.map_range(base + 9 * 4096, 2 * 4096, r) == EFAULT);  // runs past s2
    CHECK(t.map_range(base, 0, r) == EINVAL);

    // Removing s2 restores nothing of s1's trimmed pages, and mappings made
    // before stay valid.
    HostRange kept;
    REQUIRE(t.map_range(base + 6 * 4096, 4096, kept) == 0);
    CHECK(t.remove(2));
    CHECK_FALSE(t.remove(2));
    CHECK(t.find_within_one(base + 6 * 4096, 1) == nullptr);
    CHECK(kept.host[0] == 'X');
    CHECK(t.find_within_one(base, 6 * 4096) != nullptr);
    munmap(v1, 8 * 4096);
    munmap(v2, 8 * 4096);
}

TEST_CASE("QP state machine follows the IB rules", "[shim][qp]") {
    const uint32_t rc = IBV_QPT_RC, ud = IBV_QPT_UD;
    const uint32_t init_rc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    const uint32_t init_ud = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    CHECK(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, rc, init_rc));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, rc, IBV_QP_PKEY_INDEX | IBV_QP_PORT));  // missing
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, rc, init_rc | IBV_QP_QKEY));  // forbidden
    CHECK(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, ud, init_ud));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, ud, init_rc));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_RTR, rc, 0));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_RTS, ud, IBV_QP_SQ_PSN));
    const uint32_t rtr_rc = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    CHECK(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, rc, rtr_rc));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, rc, rtr_rc & ~IBV_QP_DEST_QPN));
    CHECK(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, ud, 0));
    CHECK(qp_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, ud, IBV_QP_SQ_PSN));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, rc, IBV_QP_SQ_PSN));
    CHECK(qp_modify_is_ok(IBV_QPS_RTS, IBV_QPS_ERR, rc, 0));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RTS, IBV_QPS_ERR, rc, IBV_QP_QKEY));
    CHECK(qp_modify_is_ok(IBV_QPS_ERR, IBV_QPS_RESET, rc, 0));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_ERR, IBV_QPS_RTS, rc, 0));
    CHECK(qp_modify_is_ok(IBV_QPS_SQE, IBV_QPS_RTS, ud, 0));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_SQE, IBV_QPS_RTS, rc, 0));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTR, rc, 0));
    CHECK_FALSE(qp_modify_is_ok(7, IBV_QPS_RTS, rc, 0));
    // UC: RC's path without what acknowledgements need; SQE like UD.
    const uint32_t uc = IBV_QPT_UC;
    const uint32_t rtr_uc = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    CHECK(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, uc, init_rc));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, uc, init_ud));
    CHECK(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, uc, rtr_uc));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, uc, rtr_rc));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, uc, rtr_uc & ~IBV_QP_RQ_PSN));
    CHECK(qp_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, uc, IBV_QP_SQ_PSN));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, uc, IBV_QP_SQ_PSN | IBV_QP_TIMEOUT));
    CHECK(qp_modify_is_ok(IBV_QPS_SQE, IBV_QPS_RTS, uc, IBV_QP_ACCESS_FLAGS));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_SQE, IBV_QPS_RTS, uc, IBV_QP_QKEY));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_RAW_PACKET, init_rc));
    // XRC: as RC, but the sending side sets no receive attributes at RTR and
    // the receiving side only a timeout and the PSN at RTS (the kernel's table).
    for (uint32_t xrc : {uint32_t(IBV_QPT_XRC_SEND), uint32_t(IBV_QPT_XRC_RECV)})
        CHECK(qp_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, xrc, init_rc));
    CHECK(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_XRC_SEND, rtr_uc));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_XRC_SEND, rtr_rc));
    CHECK(qp_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_XRC_RECV, rtr_rc));
    CHECK(qp_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_XRC_RECV, IBV_QP_TIMEOUT | IBV_QP_SQ_PSN));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_XRC_RECV, IBV_QP_SQ_PSN));
    CHECK_FALSE(qp_modify_is_ok(IBV_QPS_SQE, IBV_QPS_RTS, IBV_QPT_XRC_SEND, 0));
}

namespace {
// FlatMap<K, uint64_t> against std::unordered_map over `steps` random set,
// erase and find operations on keys below `range` (times `stride`).
template <class K>
void flat_map_agrees(uint64_t range, uint64_t stride) {
    CAPTURE(sizeof(K), range, stride);
    FlatMap<K, uint64_t> map;
    std::unordered_map<K, uint64_t> oracle;
    std::mt19937_64 rng(range + stride);
    for (int step = 0; step < 200000; ++step) {
        const K key = K((rng() % range) * stride);
        switch (rng() % 3) {
        case 0:
            map.set(key, step);
            oracle[key] = uint64_t(step);
            break;
        case 1:
            REQUIRE(map.erase(key) == (oracle.erase(key) == 1));
            break;
        default: {
            const uint64_t* v = map.find(key);
            auto it = oracle.find(key);
            REQUIRE((v != nullptr) == (it != oracle.end()));
            if (v) REQUIRE(*v == it->second);
        }
        }
        REQUIRE(map.size() == oracle.size());
    }
    for (auto& [k, v] : oracle) {
        REQUIRE(map.find(k));
        CHECK(*map.find(k) == v);
    }
    size_t visited = 0;
    map.for_each([&](K k, uint64_t& v) {
        ++visited;
        auto it = oracle.find(k);
        REQUIRE(it != oracle.end());
        CHECK(it->second == v);
    });
    CHECK(visited == oracle.size());
    map.clear();
    CHECK(map.size() == 0);
    for (auto& [k, v] : oracle) CHECK_FALSE(map.find(k));
}
}  // namespace

TEST_CASE("the flat map of keys and QPNs agrees with std::unordered_map through growth and churn",
          "[shim][tables]") {
    // Keys from a small range collide and cluster often, so erase's shifting
    // of the entries behind a hole is exercised; then random 24-bit keys;
    // then 64-bit keys as the fabric makes them (a LID above a QPN), where
    // only the high bits differ and the hash must still spread them.
    flat_map_agrees<uint32_t>(64, 1);
    flat_map_agrees<uint32_t>(1u << 24, 1);
    flat_map_agrees<uint64_t>(64, 1);
    flat_map_agrees<uint64_t>(1u << 24, 1);
    flat_map_agrees<uint64_t>(1u << 16, uint64_t(1) << 32);
    // The empty marker is no key, whatever a guest names.
    FlatU32Map<int> map;
    map.set(FlatU32Map<int>::kEmpty, 1);
    CHECK(map.size() == 0);
    CHECK_FALSE(map.find(FlatU32Map<int>::kEmpty));
    CHECK_FALSE(map.erase(FlatU32Map<int>::kEmpty));
    FlatMap<uint64_t, int> wide;
    wide.set(FlatMap<uint64_t, int>::kEmpty, 1);
    CHECK(wide.size() == 0);
    CHECK_FALSE(wide.find(FlatMap<uint64_t, int>::kEmpty));
}
