// Parent domains (ibv_alloc_parent_domain) through the real libibverbs: a
// QP, an MR and an extended CQ made on one carry traffic with a QP of the
// peer device, its protection domain cannot be freed under it, and the
// requests the verbs do not allow are refused.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "verbs_fixture.h"

using namespace vt;

namespace {
constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

ibv_pd* parent_of(ibv_context* ctx, ibv_pd* pd, void* pd_context = nullptr) {
    ibv_parent_domain_init_attr a{};
    a.pd = pd;
    a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    a.pd_context = pd_context;
    return ibv_alloc_parent_domain(ctx, &a);
}

ibv_cq_ex* cq_ex_on(ibv_context* ctx, ibv_pd* parent_domain) {
    ibv_cq_init_attr_ex a{};
    a.cqe = 16;
    a.wc_flags = IBV_WC_STANDARD_FLAGS;
    a.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    a.parent_domain = parent_domain;
    return ibv_create_cq_ex(ctx, &a);
}
}  // namespace

TEST_CASE("parent domain: a QP, an MR and an extended CQ on one carry traffic; its PD waits for it",
          "[parent_domain]") {
    Device dev, peer(Device::kPeer);
    int marker = 0;
    ibv_pd* pdom = parent_of(dev.ctx, dev.pd, &marker);
    REQUIRE(pdom);
    CHECK(pdom->context == dev.ctx);

    ibv_cq_ex* cqx = cq_ex_on(dev.ctx, pdom);
    REQUIRE(cqx);
    ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pdom, &qa);
    REQUIRE(qp);
    CHECK(qp->pd == pdom);
    {
        Buffer mine(pdom, 4096, kAll), theirs(peer.pd, 4096, kAll);
        CHECK(mine.mr->pd == pdom);
        Qp other(peer);
        connect_rc(qp, peer.lid, other.qpn());
        connect_rc(other.qp, dev.lid, qp->qp_num);

        // The peer sends into the parent domain's MR ...
        REQUIRE(post_recv(qp, 1, {sge(mine, 0, 64)}) == 0);
        std::memcpy(theirs.data, "to the parent domain", 21);
        ibv_send_wr wr{};
        wr.wr_id = 2;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        REQUIRE(post_send(other.qp, wr, {sge(theirs, 0, 21)}) == 0);
        auto r = poll_one(cq);
        REQUIRE(r);
        CHECK(r->status == IBV_WC_SUCCESS);
        CHECK(r->wr_id == 1);
        CHECK(std::memcmp(mine.data, "to the parent domain", 21) == 0);
        REQUIRE(poll_one(other.send_cq));

        // ... and the QP on it writes into the peer's memory with its rkey.
        std::memcpy(mine.data + 1024, "from the parent domain", 23);
        ibv_send_wr w{};
        w.wr_id = 3;
        w.opcode = IBV_WR_RDMA_WRITE;
        w.send_flags = IBV_SEND_SIGNALED;
        w.wr.rdma.remote_addr = theirs.addr(2048);
        w.wr.rdma.rkey = theirs.mr->rkey;
        REQUIRE(post_send(qp, w, {sge(mine, 1024, 23)}) == 0);
        auto s = poll_one(cq);
        REQUIRE(s);
        CHECK(s->status == IBV_WC_SUCCESS);
        CHECK(s->wr_id == 3);
        CHECK(std::memcmp(theirs.data + 2048, "from the parent domain", 23) == 0);

        // The protection domain is in use by the parent domain over it.
        CHECK(ibv_dealloc_pd(dev.pd) == EBUSY);
        REQUIRE(ibv_destroy_qp(qp) == 0);
    }
    REQUIRE(ibv_destroy_cq(cq) == 0);
    CHECK(ibv_dealloc_pd(pdom) == 0);
    // The protection domain itself is freed by the Device, after this.
}

TEST_CASE("parent domain: what the verbs do not allow is refused", "[parent_domain][api]") {
    Device dev;
    ibv_pd* pdom = parent_of(dev.ctx, dev.pd);
    REQUIRE(pdom);

    SECTION("a parent domain over a parent domain") {
        errno = 0;
        CHECK(parent_of(dev.ctx, pdom) == nullptr);
        CHECK(errno == EINVAL);
    }
    SECTION("allocators named, but not given") {
        ibv_parent_domain_init_attr a{};
        a.pd = dev.pd;
        a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
        errno = 0;
        CHECK(ibv_alloc_parent_domain(dev.ctx, &a) == nullptr);
        CHECK(errno == EINVAL);
    }
    SECTION("an extended CQ given a protection domain where a parent domain belongs") {
        errno = 0;
        CHECK(cq_ex_on(dev.ctx, dev.pd) == nullptr);
        CHECK(errno == EINVAL);
    }
    CHECK(ibv_dealloc_pd(pdom) == 0);
}
