// Tag matching (IBV_SRQT_TM) through the real libibverbs: tagged buffers
// added and deleted with ibv_post_srq_ops, eager messages matched by tag
// and mask in posting order with the header stripped, unexpected and
// untagged messages delivered whole to ordinary buffers, the phase
// synchronization after an unexpected message, rendezvous reads with the
// FIN back to the sender, a message that waits for a buffer, and the
// limits and refusals.
#include <endian.h>
#include <infiniband/tm_types.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "verbs_fixture.h"

using namespace vt;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr uint32_t kTmh = sizeof(ibv_tmh);

struct TmWc {
    uint64_t wr_id = 0;
    ibv_wc_status status = IBV_WC_SUCCESS;
    ibv_wc_opcode opcode = IBV_WC_SEND;
    unsigned wc_flags = 0;
    uint32_t byte_len = 0;
    uint64_t tag = 0;
    uint32_t priv = 0;
};

std::optional<TmWc> poll_tm(ibv_cq_ex* cq, int timeout_ms = 2000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    ibv_poll_cq_attr attr{};
    int rc;
    while ((rc = ibv_start_poll(cq, &attr)) == ENOENT && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
    if (rc != 0) return std::nullopt;
    TmWc w;
    w.wr_id = cq->wr_id;
    w.status = cq->status;
    w.opcode = ibv_wc_read_opcode(cq);
    w.wc_flags = ibv_wc_read_wc_flags(cq);
    w.byte_len = ibv_wc_read_byte_len(cq);
    ibv_wc_tm_info info{};
    ibv_wc_read_tm_info(cq, &info);
    w.tag = info.tag;
    w.priv = info.priv;
    ibv_end_poll(cq);
    return w;
}

// A QP on `srv` whose receives come from a TM SRQ, connected to a QP of
// `cli` (its own CQs).
struct TmPair {
    TmPair(Device& srv, Device& cli, uint32_t max_tags = 16) : client(cli) {
        ibv_cq_init_attr_ex ca{};
        ca.cqe = 64;
        ca.wc_flags = uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_TM_INFO;
        cq = ibv_create_cq_ex(srv.ctx, &ca);
        REQUIRE(cq);
        ibv_srq_init_attr_ex sa{};
        sa.attr.max_wr = 32;
        sa.attr.max_sge = 1;
        sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
        sa.srq_type = IBV_SRQT_TM;
        sa.pd = srv.pd;
        sa.cq = ibv_cq_ex_to_cq(cq);
        sa.tm_cap.max_num_tags = max_tags;
        sa.tm_cap.max_ops = 8;
        srq = ibv_create_srq_ex(srv.ctx, &sa);
        REQUIRE(srq);
        QpOptions o;
        o.srq = srq;
        o.send_cq = o.recv_cq = ibv_cq_ex_to_cq(cq);
        server.emplace(srv, o);
        connect_rc(server->qp, cli.lid, client.qpn());
        connect_rc(client.qp, srv.lid, server->qpn());
    }
    ~TmPair() {
        server.reset();
        ibv_destroy_srq(srq);
        ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
    }
    ibv_cq_ex* cq = nullptr;
    ibv_srq* srq = nullptr;
    Qp client;
    std::optional<Qp> server;
};

// Adds a tagged buffer; returns the handle (0: refused, errno set).
uint32_t add_tag(ibv_srq* srq, uint64_t tag, uint64_t mask, const Buffer& b, size_t off, uint32_t len,
                 uint64_t recv_wr_id, uint32_t unexpected_cnt = 0, int flags = IBV_OPS_SIGNALED) {
    ibv_sge s = sge(b, off, len);
    ibv_ops_wr op{};
    op.wr_id = 1000 + recv_wr_id;
    op.opcode = IBV_WR_TAG_ADD;
    op.flags = flags;
    op.tm.unexpected_cnt = unexpected_cnt;
    op.tm.add.recv_wr_id = recv_wr_id;
    op.tm.add.sg_list = &s;
    op.tm.add.num_sge = 1;
    op.tm.add.tag = tag;
    op.tm.add.mask = mask;
    ibv_ops_wr* bad = nullptr;
    errno = ibv_post_srq_ops(srq, &op, &bad);
    return errno ? 0 : op.tm.handle;
}

int list_op(ibv_srq* srq, ibv_ops_wr_opcode code, uint64_t wr_id, uint32_t handle, uint32_t unexpected_cnt,
            int flags) {
    ibv_ops_wr op{};
    op.wr_id = wr_id;
    op.opcode = code;
    op.flags = flags;
    op.tm.handle = handle;
    op.tm.unexpected_cnt = unexpected_cnt;
    ibv_ops_wr* bad = nullptr;
    return ibv_post_srq_ops(srq, &op, &bad);
}

// Writes a TMH at `p`.
void put_tmh(uint8_t* p, uint8_t opcode, uint64_t tag, uint32_t app_ctx) {
    ibv_tmh h{};
    h.opcode = opcode;
    h.app_ctx = htobe32(app_ctx);
    h.tag = htobe64(tag);
    std::memcpy(p, &h, sizeof(h));
}

void send_from(Qp& q, const Buffer& b, size_t off, uint32_t len, uint64_t wr_id = 77) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    REQUIRE(post_send(q.qp, wr, {sge(b, off, len)}) == 0);
}

// An EAGER message with `tag` and `len` bytes after its header; its send
// must complete.
void send_eager(TmPair& p, Buffer& tx, uint64_t tag, uint32_t len, uint32_t app_ctx = 0) {
    put_tmh(tx.data, IBV_TMH_EAGER, tag, app_ctx);
    send_from(p.client, tx, 0, kTmh + len);
    REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
}

// A signaled DEL of `handle`: the status of its completion.
ibv_wc_status del_tag(TmPair& p, uint32_t handle, uint64_t wr_id, int flags = IBV_OPS_SIGNALED) {
    REQUIRE(list_op(p.srq, IBV_WR_TAG_DEL, wr_id, handle, 0, flags) == 0);
    auto w = poll_tm(p.cq);
    REQUIRE(w);
    CHECK(w->opcode == IBV_WC_TM_DEL);
    CHECK(w->wr_id == wr_id);
    return w->status;
}

void post_ordinary(ibv_srq* srq, const Buffer& b, size_t off, uint32_t len, uint64_t wr_id) {
    ibv_sge s = sge(b, off, len);
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    REQUIRE(ibv_post_srq_recv(srq, &wr, &bad) == 0);
}

}  // namespace

TEST_CASE("tag matching: the device's caps, a TM SRQ's limits and the refusals", "[tm][api]") {
    Device dev;
    ibv_device_attr_ex da{};
    REQUIRE(ibv_query_device_ex(dev.ctx, nullptr, &da) == 0);
    CHECK((da.tm_caps.flags & IBV_TM_CAP_RC) != 0);
    CHECK(da.tm_caps.max_num_tags >= 16);
    CHECK(da.tm_caps.max_rndv_hdr_size == 64);
    CHECK(da.tm_caps.max_sge >= 1);

    // A completion holds tag-matching fields or timestamps, not both.
    ibv_cq_init_attr_ex ca{};
    ca.cqe = 8;
    ca.wc_flags = uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_TM_INFO | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
    errno = 0;
    CHECK(ibv_create_cq_ex(dev.ctx, &ca) == nullptr);
    CHECK(errno == EOPNOTSUPP);

    ibv_cq* cq = ibv_create_cq(dev.ctx, 8, nullptr, nullptr, 0);
    REQUIRE(cq);
    ibv_srq_init_attr_ex sa{};
    sa.attr.max_wr = 8;
    sa.attr.max_sge = 1;
    sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TM;
    sa.srq_type = IBV_SRQT_TM;
    sa.pd = dev.pd;
    sa.tm_cap.max_num_tags = 2;
    errno = 0;
    CHECK(ibv_create_srq_ex(dev.ctx, &sa) == nullptr);  // no CQ
    CHECK(errno == EINVAL);
    sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
    sa.cq = cq;
    sa.tm_cap.max_num_tags = da.tm_caps.max_num_tags + 1;
    errno = 0;
    CHECK(ibv_create_srq_ex(dev.ctx, &sa) == nullptr);
    CHECK(errno == EINVAL);
    sa.tm_cap.max_num_tags = 2;
    ibv_srq* srq = ibv_create_srq_ex(dev.ctx, &sa);
    REQUIRE(srq);
    {
        Buffer b(dev.pd, 4096, kAll);
        CHECK(add_tag(srq, 1, ~0ull, b, 0, 64, 1, 0, 0) != 0);
        CHECK(add_tag(srq, 2, ~0ull, b, 64, 64, 2, 0, 0) != 0);
        CHECK(add_tag(srq, 3, ~0ull, b, 128, 64, 3, 0, 0) == 0);  // max_num_tags are posted
        CHECK(errno == ENOMEM);
        ibv_sge bad_key{b.addr(), 64, b.mr->lkey + 1000};
        ibv_ops_wr op{};
        op.opcode = IBV_WR_TAG_ADD;
        op.tm.add.sg_list = &bad_key;
        op.tm.add.num_sge = 1;
        ibv_ops_wr* bad = nullptr;
        CHECK(ibv_post_srq_ops(srq, &op, &bad) == EINVAL);
        CHECK(bad == &op);
        CHECK(list_op(srq, IBV_WR_TAG_DEL, 9, 77, 0, 0) == EINVAL);  // no such entry
    }
    // A basic SRQ has no tag list.
    ibv_srq_init_attr basic{};
    basic.attr.max_wr = 4;
    basic.attr.max_sge = 1;
    ibv_srq* plain = ibv_create_srq(dev.pd, &basic);
    REQUIRE(plain);
    CHECK(list_op(plain, IBV_WR_TAG_SYNC, 9, 0, 0, IBV_OPS_SIGNALED) == EINVAL);
    CHECK(ibv_destroy_srq(plain) == 0);
    CHECK(ibv_destroy_srq(srq) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("tag matching: eager messages match by tag and mask in posting order, without their header",
          "[tm]") {
    Device dev, peer(Device::kPeer);
    TmPair p(dev, peer);
    Buffer rx(dev.pd, 8192, kAll), tx(peer.pd, 4096, kAll);

    // A posted first (any tag 0x1xx), B second (exactly 0x105).
    const uint32_t ha = add_tag(p.srq, 0x100, 0xff00, rx, 0, 1024, 11);
    const uint32_t hb = add_tag(p.srq, 0x105, ~0ull, rx, 1024, 1024, 12);
    REQUIRE(ha);
    REQUIRE(hb);
    for (uint64_t id : {1011, 1012}) {
        auto w = poll_tm(p.cq);
        REQUIRE(w);
        CHECK(w->opcode == IBV_WC_TM_ADD);
        CHECK(w->wr_id == id);
        CHECK(w->status == IBV_WC_SUCCESS);
        CHECK(w->wc_flags == 0);  // in sync
    }
    for (uint64_t expect_wr : {11, 12}) {
        put_tmh(tx.data, IBV_TMH_EAGER, 0x105, 0xabcd);
        pattern(tx.data + kTmh, 500, uint8_t(expect_wr));
        send_from(p.client, tx, 0, kTmh + 500);
        CHECK(complete(p.client.send_cq) == IBV_WC_SUCCESS);
        auto w = poll_tm(p.cq);
        REQUIRE(w);
        CHECK(w->status == IBV_WC_SUCCESS);
        CHECK(w->opcode == IBV_WC_TM_RECV);
        CHECK(w->wr_id == expect_wr);
        CHECK(w->wc_flags == (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID));
        CHECK(w->byte_len == 500);
        CHECK(w->tag == 0x105);
        CHECK(w->priv == 0xabcd);
        CHECK(has_pattern(rx.data + (expect_wr == 11 ? 0 : 1024), 500, uint8_t(expect_wr)));
    }
    // A consumed entry cannot be deleted (an error completes even
    // unsignaled); a posted one can.
    CHECK(del_tag(p, ha, 21, 0) == IBV_WC_TM_ERR);
    const uint32_t hc = add_tag(p.srq, 0x300, ~0ull, rx, 2048, 1024, 13, 0, 0);
    REQUIRE(hc);
    CHECK(del_tag(p, hc, 22) == IBV_WC_SUCCESS);

    // A handle names its entry only: once a message took it, a DEL of it
    // fails even when a newer entry holds its place, and the newer one stays.
    const uint32_t hd = add_tag(p.srq, 0x400, ~0ull, rx, 4096, 1024, 14, 0, 0);
    REQUIRE(hd);
    send_eager(p, tx, 0x400, 8);
    auto took = poll_tm(p.cq);
    REQUIRE(took);
    CHECK(took->wr_id == 14);
    REQUIRE(add_tag(p.srq, 0x500, ~0ull, rx, 4096, 1024, 15, 0, 0));
    CHECK(del_tag(p, hd, 23) == IBV_WC_TM_ERR);
    send_eager(p, tx, 0x500, 8);
    took = poll_tm(p.cq);
    REQUIRE(took);
    CHECK(took->wr_id == 15);
    CHECK(took->wc_flags == (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID));
}

TEST_CASE("tag matching: unexpected and untagged messages go whole to ordinary buffers; tags wait for the sync",
          "[tm]") {
    Device dev, peer(Device::kPeer);
    TmPair p(dev, peer);
    Buffer rx(dev.pd, 16384, kAll), tx(peer.pd, 4096, kAll);
    for (uint64_t i = 0; i < 4; ++i) post_ordinary(p.srq, rx, 4096 * i, 4096, 50 + i);

    // Tag 7 is not posted: unexpected, header and all, counted.
    put_tmh(tx.data, IBV_TMH_EAGER, 7, 1);
    pattern(tx.data + kTmh, 100, 1);
    send_from(p.client, tx, 0, kTmh + 100);
    REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
    auto w = poll_tm(p.cq);
    REQUIRE(w);
    CHECK(w->opcode == IBV_WC_TM_RECV);
    CHECK(w->wr_id == 50);
    CHECK(w->wc_flags == 0);
    CHECK(w->byte_len == kTmh + 100);
    CHECK(std::memcmp(rx.data, tx.data, kTmh + 100) == 0);

    // Software has not reported it yet: a tag added now says a sync is
    // needed and matches nothing.
    REQUIRE(add_tag(p.srq, 7, ~0ull, rx, 12288 + 0, 1024, 60, 0));
    w = poll_tm(p.cq);
    REQUIRE(w);
    CHECK(w->opcode == IBV_WC_TM_ADD);
    CHECK((w->wc_flags & IBV_WC_TM_SYNC_REQ) != 0);
    send_from(p.client, tx, 0, kTmh + 100);
    REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
    w = poll_tm(p.cq);
    REQUIRE(w);
    CHECK(w->wr_id == 51);  // an ordinary buffer again
    CHECK(w->wc_flags == 0);

    // Both reported: tag 7 matches.
    REQUIRE(list_op(p.srq, IBV_WR_TAG_SYNC, 70, 0, 2, IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC) == 0);
    w = poll_tm(p.cq);
    REQUIRE(w);
    CHECK(w->opcode == IBV_WC_TM_SYNC);
    CHECK(w->wr_id == 70);
    CHECK(w->wc_flags == 0);
    send_from(p.client, tx, 0, kTmh + 100);
    REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
    w = poll_tm(p.cq);
    REQUIRE(w);
    CHECK(w->wr_id == 60);
    CHECK(w->wc_flags == (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID));
    CHECK(w->tag == 7);

    // NO_TAG: whole, IBV_WC_TM_NO_TAG, not counted.
    put_tmh(tx.data, IBV_TMH_NO_TAG, 0, 0);
    send_from(p.client, tx, 0, 300);
    REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
    w = poll_tm(p.cq);
    REQUIRE(w);
    CHECK(w->opcode == IBV_WC_TM_NO_TAG);
    CHECK(w->wr_id == 52);
    CHECK(w->byte_len == 300);
    CHECK(std::memcmp(rx.data + 2 * 4096, tx.data, 300) == 0);
}

TEST_CASE("tag matching: a rendezvous reads the sender's buffer into the tagged one and sends it a FIN",
          "[tm]") {
    // Both QPs in one context: the shim reads the sender's memory itself.
    Device dev;
    TmPair p(dev, dev);
    Buffer rx(dev.pd, 16384, kAll), data(dev.pd, 8192, kAll), hdr(dev.pd, 4096, kAll);
    pattern(data.data, 8192, 33);
    REQUIRE(add_tag(p.srq, 0x42, ~0ull, rx, 0, 8192, 81));
    REQUIRE(poll_tm(p.cq));
    REQUIRE(post_recv(p.client.qp, 90, {sge(hdr, 2048, 64)}) == 0);  // for the FIN

    // A rendezvous request for `len` bytes of `src`, with tag `tag`.
    auto rndv = [&](const Buffer& src, uint32_t len, uint64_t tag = 0x42) {
        put_tmh(hdr.data, IBV_TMH_RNDV, tag, 0x77);
        ibv_rvh r{};
        r.va = htobe64(src.addr());
        r.rkey = htobe32(src.mr->rkey);
        r.len = htobe32(len);
        std::memcpy(hdr.data + kTmh, &r, sizeof(r));
        pattern(hdr.data + kTmh + sizeof(r), 32, 5);  // software's meta-data
        send_from(p.client, hdr, 0, 64);
    };
    rndv(data, 8192);
    // The sender's send completes first, then the match, the FIN, the data.
    REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
    auto m = poll_tm(p.cq);
    REQUIRE(m);
    CHECK(m->opcode == IBV_WC_TM_RECV);
    CHECK(m->wr_id == 81);
    CHECK(m->wc_flags == IBV_WC_TM_MATCH);
    CHECK(m->tag == 0x42);
    CHECK(m->priv == 0x77);
    auto fin = poll_one(p.client.recv_cq);
    REQUIRE(fin);
    CHECK(fin->status == IBV_WC_SUCCESS);
    CHECK(fin->opcode == IBV_WC_RECV);
    CHECK(fin->wr_id == 90);
    CHECK(fin->byte_len == 32);
    CHECK(hdr.data[2048] == IBV_TMH_FIN);
    CHECK(std::memcmp(hdr.data + 2048 + 1, hdr.data + 1, 31) == 0);  // the request's TMH and RVH
    auto dv = poll_tm(p.cq);
    REQUIRE(dv);
    CHECK(dv->status == IBV_WC_SUCCESS);
    CHECK(dv->opcode == IBV_WC_TM_RECV);
    CHECK(dv->wr_id == 81);
    CHECK(dv->wc_flags == IBV_WC_TM_DATA_VALID);
    CHECK(dv->byte_len == 8192);
    CHECK(has_pattern(rx.data, 8192, 33));

    // A large one moves a slice per step, other work in between.
    {
        Buffer big_src(dev.pd, 4 << 20, kAll), big_dst(dev.pd, 4 << 20, kAll);
        pattern(big_src.data, 4 << 20, 44);
        REQUIRE(add_tag(p.srq, 0x43, ~0ull, big_dst, 0, 4 << 20, 83));
        REQUIRE(poll_tm(p.cq));
        REQUIRE(post_recv(p.client.qp, 91, {sge(hdr, 2048, 64)}) == 0);
        rndv(big_src, 4 << 20, 0x43);
        REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
        auto bm = poll_tm(p.cq);
        REQUIRE(bm);
        CHECK(bm->wc_flags == IBV_WC_TM_MATCH);
        auto bd = poll_tm(p.cq, 10000);
        REQUIRE(bd);
        CHECK(bd->status == IBV_WC_SUCCESS);
        CHECK(bd->wc_flags == IBV_WC_TM_DATA_VALID);
        CHECK(bd->byte_len == uint32_t(4 << 20));
        CHECK(has_pattern(big_dst.data, 4 << 20, 44));
        auto bf = poll_one(p.client.recv_cq);
        REQUIRE(bf);
        CHECK(bf->wr_id == 91);
    }

    // A tagged buffer too small for the data: software finishes it, with
    // the headers in the buffer.
    REQUIRE(add_tag(p.srq, 0x42, ~0ull, rx, 8192, 1024, 82));
    REQUIRE(poll_tm(p.cq));
    rndv(data, 8192);
    REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
    auto inc = poll_tm(p.cq);
    REQUIRE(inc);
    CHECK(inc->status == IBV_WC_TM_RNDV_INCOMPLETE);
    CHECK(inc->wr_id == 82);
    CHECK(inc->byte_len == 64);
    CHECK(std::memcmp(rx.data + 8192, hdr.data, 64) == 0);
}

TEST_CASE("tag matching: a rendezvous from another guest is read through the QP's transport", "[tm]") {
    // The sender in another guest: on the same worker it is read directly;
    // on another worker (--workers 2) or shim (two-hosts) through the
    // shim's rendezvous reads and FIN. The same results either way.
    Device dev, peer(Device::kPeer);
    TmPair p(dev, peer, 32);
    constexpr uint32_t kBig = (1 << 20) + 5;  // pieces of 64 KiB and a short last one
    Buffer rx(dev.pd, 2 << 20, kAll), src(peer.pd, 2 << 20, kAll), hdr(peer.pd, 8192, kAll);
    Buffer no_read(peer.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    pattern(src.data, 2 << 20, 61);

    auto rndv = [&](uint64_t va, uint32_t rkey, uint32_t len, uint64_t tag, size_t at) {
        put_tmh(hdr.data + at, IBV_TMH_RNDV, tag, uint32_t(tag) + 0x100);
        ibv_rvh r{};
        r.va = htobe64(va);
        r.rkey = htobe32(rkey);
        r.len = htobe32(len);
        std::memcpy(hdr.data + at + kTmh, &r, sizeof(r));
        send_from(p.client, hdr, at, 64);
        REQUIRE(complete(p.client.send_cq) == IBV_WC_SUCCESS);
    };
    auto matched = [&](uint64_t wr_id, uint64_t tag) {
        auto m = poll_tm(p.cq);
        REQUIRE(m);
        CHECK(m->status == IBV_WC_SUCCESS);
        CHECK(m->wr_id == wr_id);
        CHECK(m->wc_flags == IBV_WC_TM_MATCH);
        CHECK(m->tag == tag);
        CHECK(m->priv == uint32_t(tag) + 0x100);
    };
    auto data = [&](uint64_t wr_id) {
        auto d = poll_tm(p.cq, 20000);
        REQUIRE(d);
        CHECK(d->wr_id == wr_id);
        return *d;
    };
    auto fin = [&](uint64_t wr_id, size_t at) {
        auto f = poll_one(p.client.recv_cq, 5000);
        REQUIRE(f);
        CHECK(f->status == IBV_WC_SUCCESS);
        CHECK(f->wr_id == wr_id);
        CHECK(f->byte_len == 32);
        CHECK(hdr.data[4096 + 64 * (wr_id - 90)] == IBV_TMH_FIN);
        CHECK(std::memcmp(hdr.data + 4096 + 64 * (wr_id - 90) + 1, hdr.data + at + 1, 31) == 0);
    };
    for (uint64_t i = 0; i < 4; ++i) REQUIRE(post_recv(p.client.qp, 90 + i, {sge(hdr, 4096 + 64 * i, 64)}) == 0);

    // One piece, then two back to back (the second queued behind the
    // first's pieces), then no data at all.
    REQUIRE(add_tag(p.srq, 0x51, ~0ull, rx, 0, 8192, 1));
    REQUIRE(add_tag(p.srq, 0x52, ~0ull, rx, 8192, kBig, 2));
    REQUIRE(add_tag(p.srq, 0x53, ~0ull, rx, 8192 + kBig, 4096, 3));
    REQUIRE(add_tag(p.srq, 0x54, ~0ull, rx, 16384 + kBig, 64, 4));
    for (int i = 0; i < 4; ++i) REQUIRE(poll_tm(p.cq));
    rndv(src.addr() + 100, src.mr->rkey, 8192, 0x51, 0);
    matched(1, 0x51);
    auto d1 = data(1);
    CHECK(d1.status == IBV_WC_SUCCESS);
    CHECK(d1.wc_flags == IBV_WC_TM_DATA_VALID);
    CHECK(d1.byte_len == 8192);
    CHECK(std::memcmp(rx.data, src.data + 100, 8192) == 0);
    fin(90, 0);

    rndv(src.addr(), src.mr->rkey, kBig, 0x52, 64);
    rndv(src.addr() + 3, src.mr->rkey, 4096, 0x53, 128);
    // Each match before its data, the first data before the second (its
    // reads queue behind the first's); the second match may come before or
    // after the first data.
    std::vector<TmWc> four;
    for (int i = 0; i < 4; ++i) {
        auto w = poll_tm(p.cq, 20000);
        REQUIRE(w);
        four.push_back(*w);
    }
    auto at = [&](uint64_t wr_id, unsigned flags) {
        for (size_t i = 0; i < four.size(); ++i)
            if (four[i].wr_id == wr_id && four[i].wc_flags == flags) return int(i);
        return -1;
    };
    REQUIRE(at(2, IBV_WC_TM_MATCH) >= 0);
    REQUIRE(at(3, IBV_WC_TM_MATCH) >= 0);
    REQUIRE(at(2, IBV_WC_TM_DATA_VALID) >= 0);
    REQUIRE(at(3, IBV_WC_TM_DATA_VALID) >= 0);
    CHECK(at(2, IBV_WC_TM_MATCH) < at(2, IBV_WC_TM_DATA_VALID));
    CHECK(at(3, IBV_WC_TM_MATCH) < at(3, IBV_WC_TM_DATA_VALID));
    CHECK(at(2, IBV_WC_TM_DATA_VALID) < at(3, IBV_WC_TM_DATA_VALID));
    CHECK(four[size_t(at(3, IBV_WC_TM_MATCH))].tag == 0x53);
    const TmWc& d2 = four[size_t(at(2, IBV_WC_TM_DATA_VALID))];
    CHECK(d2.status == IBV_WC_SUCCESS);
    CHECK(d2.byte_len == kBig);
    const TmWc& d3 = four[size_t(at(3, IBV_WC_TM_DATA_VALID))];
    CHECK(d3.status == IBV_WC_SUCCESS);
    CHECK(d3.byte_len == 4096);
    CHECK(std::memcmp(rx.data + 8192, src.data, kBig) == 0);
    CHECK(std::memcmp(rx.data + 8192 + kBig, src.data + 3, 4096) == 0);
    fin(91, 64);
    fin(92, 128);

    rndv(src.addr(), src.mr->rkey, 0, 0x54, 192);
    matched(4, 0x54);
    auto d4 = data(4);
    CHECK(d4.status == IBV_WC_SUCCESS);
    CHECK(d4.byte_len == 0);
    fin(93, 192);

    // The sender's buffer is not readable remotely: the rendezvous fails
    // with a remote access error, no FIN goes, and both QPs go on.
    REQUIRE(add_tag(p.srq, 0x55, ~0ull, rx, 0, 4096, 5));
    REQUIRE(poll_tm(p.cq));
    REQUIRE(post_recv(p.client.qp, 94, {sge(hdr, 4096 + 64 * 4, 64)}) == 0);
    rndv(no_read.addr(), no_read.mr->rkey, 4096, 0x55, 256);
    matched(5, 0x55);
    auto d5 = data(5);
    CHECK(d5.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(!poll_one(p.client.recv_cq, 100));
    REQUIRE(add_tag(p.srq, 0x56, ~0ull, rx, 0, 4096, 6));
    REQUIRE(poll_tm(p.cq));
    rndv(src.addr(), src.mr->rkey, 4096, 0x56, 320);
    matched(6, 0x56);
    CHECK(data(6).status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(rx.data, src.data, 4096) == 0);
    fin(94, 320);
}

TEST_CASE("tag matching: a message with no buffer of its kind waits for one", "[tm]") {
    Device dev, peer(Device::kPeer);
    TmPair p(dev, peer);
    Buffer rx(dev.pd, 4096, kAll), tx(peer.pd, 4096, kAll);
    put_tmh(tx.data, IBV_TMH_EAGER, 9, 0);
    pattern(tx.data + kTmh, 64, 9);
    send_from(p.client, tx, 0, kTmh + 64);
    CHECK(cq_stays_empty(ibv_cq_ex_to_cq(p.cq), 100));  // RNR NAKs meanwhile
    REQUIRE(add_tag(p.srq, 9, ~0ull, rx, 0, 1024, 5, 0, 0));
    auto w = poll_tm(p.cq, 5000);
    REQUIRE(w);
    CHECK(w->wr_id == 5);
    CHECK(w->wc_flags == (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID));
    CHECK(has_pattern(rx.data, 64, 9));
    CHECK(complete(p.client.send_cq) == IBV_WC_SUCCESS);
}

TEST_CASE("tag matching: a send larger than a TM SRQ takes is a remote invalid request", "[tm]") {
    Device dev, peer(Device::kPeer);
    TmPair p(dev, peer);
    Buffer rx(dev.pd, 4096, kAll), tx(peer.pd, (64 << 10) + 4096, kAll);
    post_ordinary(p.srq, rx, 0, 4096, 1);
    put_tmh(tx.data, IBV_TMH_EAGER, 1, 0);
    send_from(p.client, tx, 0, (64 << 10) + 1);
    CHECK(complete(p.client.send_cq) == IBV_WC_REM_INV_REQ_ERR);
    CHECK(cq_stays_empty(ibv_cq_ex_to_cq(p.cq), 50));  // nothing was taken
}
