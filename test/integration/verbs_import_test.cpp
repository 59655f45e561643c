// Importing a context (ibv_import_device) and its objects by handle
// (ibv_import_pd, ibv_import_mr, ibv_import_dm) through the real
// libibverbs: a QP made on the import with the imported PD and MR carries
// traffic, device memory written through one is read through the other,
// the imported context outlives the one that opened the device, and what
// names nothing is refused.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "verbs_fixture.h"

using namespace vt;

namespace {
constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

ibv_context* import_of(ibv_context* ctx) {
    const int fd = ::fcntl(ctx->cmd_fd, F_DUPFD_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    ibv_context* imp = ibv_import_device(fd);
    if (!imp) ::close(fd);
    return imp;
}

// A QP on `ctx` in `pd`, with one CQ of its own, connected to `peer_qp`.
struct QpOn {
    QpOn(ibv_context* ctx, ibv_pd* pd, Device& peer, Qp& peer_qp, uint16_t lid) {
        cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
        REQUIRE(cq);
        ibv_qp_init_attr qa{};
        qa.send_cq = qa.recv_cq = cq;
        qa.qp_type = IBV_QPT_RC;
        qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
        qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
        qp = ibv_create_qp(pd, &qa);
        REQUIRE(qp);
        connect_rc(qp, peer.lid, peer_qp.qpn());
        connect_rc(peer_qp.qp, lid, qp->qp_num);
    }
    ~QpOn() {
        ibv_destroy_qp(qp);
        ibv_destroy_cq(cq);
    }
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
};

// `from` sends `len` bytes of `src` (its lkey `lkey`) to `to`, which
// receives them into `dst`; both completions must succeed.
void send_once(ibv_qp* from, ibv_cq* from_cq, const void* src, uint32_t lkey, ibv_qp* to, ibv_cq* to_cq,
               const Buffer& dst, uint32_t len) {
    REQUIRE(post_recv(to, 7, {sge(dst, 0, len)}) == 0);
    ibv_send_wr wr{};
    wr.wr_id = 8;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_sge s{reinterpret_cast<uint64_t>(src), len, lkey};
    REQUIRE(post_send(from, wr, {s}) == 0);
    auto r = poll_one(to_cq);
    REQUIRE(r);
    CHECK(r->status == IBV_WC_SUCCESS);
    CHECK(r->byte_len == len);
    auto s2 = poll_one(from_cq);
    REQUIRE(s2);
    CHECK(s2->status == IBV_WC_SUCCESS);
}
}  // namespace

TEST_CASE("import: a context imported from the command fd uses the PD and MR of the first by handle",
          "[import]") {
    Device dev, peer(Device::kPeer);
    ibv_context* imp = import_of(dev.ctx);
    REQUIRE(imp);
    CHECK(imp->device == dev.ctx->device);

    Buffer mine(dev.pd, 4096, kAll), theirs(peer.pd, 4096, kAll);
    ibv_pd* ipd = ibv_import_pd(imp, dev.pd->handle);
    REQUIRE(ipd);
    CHECK(ipd->context == imp);
    CHECK(ipd->handle == dev.pd->handle);
    ibv_mr* imr = ibv_import_mr(ipd, mine.mr->handle);
    REQUIRE(imr);
    CHECK(imr->context == imp);
    CHECK(imr->pd == ipd);
    CHECK(imr->lkey == mine.mr->lkey);
    CHECK(imr->rkey == mine.mr->rkey);
    CHECK(imr->length == mine.mr->length);
    CHECK(imr->handle == mine.mr->handle);
    CHECK(imr->addr == nullptr);  // ibv_import_mr(3): not applicable

    {
        // A QP of the imported context, in the imported PD, sends out of the
        // imported MR; the peer writes into it with its rkey.
        Qp other(peer);
        QpOn q(imp, ipd, peer, other, dev.lid);
        pattern(mine.data, 512, 3);
        send_once(q.qp, q.cq, mine.data, imr->lkey, other.qp, other.recv_cq, theirs, 512);
        CHECK(has_pattern(theirs.data, 512, 3));

        pattern(theirs.data + 1024, 256, 9);
        ibv_send_wr w{};
        w.wr_id = 9;
        w.opcode = IBV_WR_RDMA_WRITE;
        w.send_flags = IBV_SEND_SIGNALED;
        w.wr.rdma.remote_addr = mine.addr(2048);
        w.wr.rdma.rkey = imr->rkey;
        REQUIRE(post_send(other.qp, w, {sge(theirs, 1024, 256)}) == 0);
        CHECK(complete(other.send_cq) == IBV_WC_SUCCESS);
        CHECK(has_pattern(mine.data + 2048, 256, 9));
    }

    // Unimporting leaves the objects to the first context, which still
    // uses them.
    ibv_unimport_mr(imr);
    ibv_unimport_pd(ipd);
    {
        Qp a(dev), b(peer);
        connect_rc(a.qp, peer.lid, b.qpn());
        connect_rc(b.qp, dev.lid, a.qpn());
        pattern(mine.data, 128, 5);
        send_once(a.qp, a.send_cq, mine.data, mine.mr->lkey, b.qp, b.recv_cq, theirs, 128);
        CHECK(has_pattern(theirs.data, 128, 5));
    }

    // A PD deallocated through an import is gone for both.
    ibv_pd* extra = ibv_alloc_pd(dev.ctx);
    REQUIRE(extra);
    const uint32_t extra_handle = extra->handle;
    ibv_pd* extra_imp = ibv_import_pd(imp, extra_handle);
    REQUIRE(extra_imp);
    CHECK(ibv_dealloc_pd(extra_imp) == 0);
    errno = 0;
    CHECK(ibv_import_pd(imp, extra_handle) == nullptr);
    CHECK(errno == EINVAL);
    ibv_unimport_pd(extra);  // the first context's struct is stale, as on a kernel device: free it

    CHECK(ibv_close_device(imp) == 0);
}

TEST_CASE("import: device memory written through one context is read through the import", "[import]") {
    Device dev;
    ibv_alloc_dm_attr da{};
    da.length = 4096;
    ibv_dm* dm = ibv_alloc_dm(dev.ctx, &da);
    REQUIRE(dm);
    ibv_context* imp = import_of(dev.ctx);
    REQUIRE(imp);
    ibv_dm* idm = ibv_import_dm(imp, dm->handle);
    REQUIRE(idm);
    CHECK(idm->context == imp);

    uint8_t out[256], in[256];
    pattern(out, sizeof(out), 11);
    REQUIRE(ibv_memcpy_to_dm(dm, 512, out, sizeof(out)) == 0);
    REQUIRE(ibv_memcpy_from_dm(in, idm, 512, sizeof(in)) == 0);
    CHECK(has_pattern(in, sizeof(in), 11));
    pattern(out, sizeof(out), 12);
    REQUIRE(ibv_memcpy_to_dm(idm, 0, out, sizeof(out)) == 0);
    REQUIRE(ibv_memcpy_from_dm(in, dm, 0, sizeof(in)) == 0);
    CHECK(has_pattern(in, sizeof(in), 12));

    ibv_unimport_dm(idm);
    REQUIRE(ibv_memcpy_from_dm(in, dm, 0, sizeof(in)) == 0);  // the first mapping stays
    CHECK(has_pattern(in, sizeof(in), 12));
    const uint32_t handle = dm->handle;
    CHECK(ibv_free_dm(dm) == 0);
    errno = 0;
    CHECK(ibv_import_dm(imp, handle) == nullptr);  // freed: nothing to import
    CHECK(errno == EINVAL);
    CHECK(ibv_close_device(imp) == 0);
}

TEST_CASE("import: the imported context outlives the one that opened the device", "[import]") {
    Device peer(Device::kPeer);
    auto* first = new Device;
    const uint16_t lid = first->lid;
    ibv_context* imp = import_of(first->ctx);
    REQUIRE(imp);
    delete first;  // closes the first context (and frees its PD)

    ibv_pd* pd = ibv_alloc_pd(imp);
    REQUIRE(pd);
    {
        Buffer mine(pd, 4096, kAll), theirs(peer.pd, 4096, kAll);
        Qp other(peer);
        QpOn q(imp, pd, peer, other, lid);
        pattern(mine.data, 300, 21);
        send_once(q.qp, q.cq, mine.data, mine.mr->lkey, other.qp, other.recv_cq, theirs, 300);
        CHECK(has_pattern(theirs.data, 300, 21));
    }
    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(ibv_close_device(imp) == 0);
}

TEST_CASE("import: handles and fds that name nothing are refused", "[import]") {
    Device dev;
    ibv_context* imp = import_of(dev.ctx);
    REQUIRE(imp);
    errno = 0;
    CHECK(ibv_import_pd(imp, 0x7fffffff) == nullptr);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(ibv_import_mr(dev.pd, 0x7fffffff) == nullptr);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(ibv_import_dm(imp, 0x7fffffff) == nullptr);
    CHECK(errno == EINVAL);
    CHECK(ibv_close_device(imp) == 0);

    // An open /dev/null that is no context's command fd: libibverbs finds
    // vrdma0 by its device number, and the provider says it cannot import it.
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(devnull >= 0);
    errno = 0;
    CHECK(ibv_import_device(devnull) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    ::close(devnull);
    // Not a character device at all.
    int p[2];
    REQUIRE(::pipe(p) == 0);
    errno = 0;
    CHECK(ibv_import_device(p[0]) == nullptr);
    CHECK(errno == EINVAL);
    ::close(p[0]);
    ::close(p[1]);
}
