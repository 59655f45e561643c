// Bad arguments at the API get the errno other providers give; device and
// port queries say what the shim enforces; memory registration keeps the
// application's data.
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "verbs_fixture.h"

using namespace vt;

TEST_CASE("device and port attributes", "[api]") {
    Device dev;
    ibv_device_attr da{};
    REQUIRE(ibv_query_device(dev.ctx, &da) == 0);
    CHECK(da.phys_port_cnt == 1);
    CHECK(da.max_qp > 0);
    CHECK(da.max_sge >= 4);
    ibv_device_attr_ex dax{};
    REQUIRE(ibv_query_device_ex(dev.ctx, nullptr, &dax) == 0);
    CHECK(dax.orig_attr.max_qp == da.max_qp);
    ibv_port_attr pa{};
    REQUIRE(ibv_query_port(dev.ctx, 1, &pa) == 0);
    CHECK(pa.state == IBV_PORT_ACTIVE);
    CHECK(pa.link_layer == IBV_LINK_LAYER_INFINIBAND);
    CHECK(pa.lid != 0);
    CHECK(pa.max_msg_sz > 0);
    CHECK(ibv_query_port(dev.ctx, 2, &pa) != 0);
    union ibv_gid gid;
    REQUIRE(ibv_query_gid(dev.ctx, 1, 0, &gid) == 0);
    CHECK(gid.raw[0] == 0xfe);
    CHECK(gid.raw[1] == 0x80);
    __be16 pkey;
    REQUIRE(ibv_query_pkey(dev.ctx, 1, 0, &pkey) == 0);
    CHECK(pkey == 0xffff);
}

TEST_CASE("bad arguments get EINVAL or ENOMEM, never a crash", "[api]") {
    Device dev;
    ibv_device_attr da{};
    REQUIRE(ibv_query_device(dev.ctx, &da) == 0);
    ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
    REQUIRE(cq);
    CHECK(ibv_create_cq(dev.ctx, da.max_cqe + 1, nullptr, nullptr, 0) == nullptr);

    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = da.max_qp_wr + 1;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    errno = 0;
    CHECK(ibv_create_qp(dev.pd, &ia) == nullptr);
    CHECK(errno == EINVAL);
    ia.cap.max_send_wr = 4;
    ia.cap.max_send_sge = da.max_sge + 1;
    CHECK(ibv_create_qp(dev.pd, &ia) == nullptr);
    ia.cap.max_send_sge = 2;
    ibv_qp* qp = ibv_create_qp(dev.pd, &ia);
    REQUIRE(qp);
    CHECK(ia.cap.max_send_wr >= 4);

    // Posting sends in RESET, too many SGEs, a full queue.
    Buffer buf(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_send_wr wr{}, *bad = nullptr;
    ibv_sge s[3] = {sge(buf, 0, 8), sge(buf, 8, 8), sge(buf, 16, 8)};
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = s;
    wr.num_sge = 1;
    CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL);
    CHECK(bad == &wr);

    // Invalid state transition: RESET -> RTS.
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
    // RESET -> INIT without the required attributes.
    a.qp_state = IBV_QPS_INIT;
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
    connect_rc(qp, dev.lid, qp->qp_num);  // loopback to itself
    wr.num_sge = 3;
    bad = nullptr;
    CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL);
    CHECK(bad == &wr);

    // A receive queue that is full gives ENOMEM.
    ibv_recv_wr rw{}, *rbad = nullptr;
    rw.sg_list = s;
    rw.num_sge = 1;
    int rc = 0;
    for (int i = 0; i < 100000 && rc == 0; ++i) rc = ibv_post_recv(qp, &rw, &rbad);
    CHECK(rc == ENOMEM);

    CHECK(ibv_destroy_qp(qp) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("memory registration preserves the data and sees memory mapped anew", "[mr]") {
    Device dev;
    // Heap memory with data already in it.
    size_t len = 3 * 4096 + 100;
    auto* heap = static_cast<uint8_t*>(std::malloc(len));
    for (size_t i = 0; i < len; ++i) heap[i] = uint8_t(i * 31);
    ibv_mr* mr = ibv_reg_mr(dev.pd, heap, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    REQUIRE(mr);
    bool intact = true;
    for (size_t i = 0; i < len; ++i) intact &= heap[i] == uint8_t(i * 31);
    CHECK(intact);
    // A second, overlapping registration.
    ibv_mr* mr2 = ibv_reg_mr(dev.pd, heap + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(mr2);
    CHECK(ibv_dereg_mr(mr2) == 0);
    CHECK(ibv_dereg_mr(mr) == 0);
    std::free(heap);

    // Unmap registered memory, map anew at the same address, register again:
    // the new contents travel, not the old shared pages.
    void* p = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    std::memset(p, 'o', 8192);
    ibv_mr* old_mr = ibv_reg_mr(dev.pd, p, 8192, IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(old_mr);
    REQUIRE(munmap(p, 8192) == 0);
    void* q = mmap(p, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    REQUIRE(q == p);
    std::memset(q, 'n', 8192);
    ibv_mr* new_mr = ibv_reg_mr(dev.pd, q, 8192, IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(new_mr);
    Qp a(dev), b(dev);
    connect_rc(a.qp, dev.lid, b.qpn());
    connect_rc(b.qp, dev.lid, a.qpn());
    Buffer dst(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(post_recv(b.qp, 1, {sge(dst, 0, 64)}) == 0);
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    REQUIRE(post_send(a.qp, wr, {ibv_sge{reinterpret_cast<uint64_t>(q), 64, new_mr->lkey}}) == 0);
    REQUIRE(poll_one(a.send_cq)->status == IBV_WC_SUCCESS);
    REQUIRE(poll_one(b.recv_cq)->status == IBV_WC_SUCCESS);
    CHECK(dst.data[0] == 'n');
    CHECK(dst.data[63] == 'n');
    CHECK(ibv_dereg_mr(new_mr) == 0);
    CHECK(ibv_dereg_mr(old_mr) == 0);
    munmap(q, 8192);
}

TEST_CASE("memory registration of a shared file mapping, and of its part unmapped since", "[mr]") {
    Device dev;
    // A shared mapping of an ordinary file registers (the shim maps the same
    // file, verbs_memory_test.cpp); an address range with nothing mapped is
    // refused with a clear error.
    char path[] = "/tmp/vrdma-mr-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 4096) == 0);
    void* f = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(f != MAP_FAILED);
    ibv_mr* file_mr = ibv_reg_mr(dev.pd, f, 4096, IBV_ACCESS_LOCAL_WRITE);
    CHECK(file_mr != nullptr);
    if (file_mr) CHECK(ibv_dereg_mr(file_mr) == 0);
    munmap(static_cast<char*>(f) + 4096, 4096);
    errno = 0;
    CHECK(ibv_reg_mr(dev.pd, static_cast<char*>(f) + 4096, 4096, IBV_ACCESS_LOCAL_WRITE) == nullptr);
    CHECK(errno == EFAULT);
    munmap(f, 4096);
    close(fd);
    unlink(path);
}
