// The seeds of fuzz_fabric (test/fuzz/corpus/fabric/): valid peer streams
// (SEND, multi-segment SEND and RDMA WRITE, READ requests, atomics, UD
// datagrams, responses to a's own requests, RNR) and a few malformed ones,
// built from the harness's FabricWorld so that QPNs, keys and addresses are the
// ones the harness sets up. Regenerate after changing the World:
//
//   VRDMA_FUZZ_FABRIC_SEEDS=test/fuzz/corpus/fabric build-fuzz/test/fuzz/fuzz_fabric
//
// Included by fuzz_fabric.cpp after its World.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace fabric_seeds {

using vrdma::shim::Request;
using vrdma::shim::Response;
using vrdma::shim::Syndrome;

struct Seed {
    std::string name;
    uint8_t flags = 0;
    struct Chunk {
        uint16_t len;
        uint8_t act;
    };
    std::vector<Chunk> chunks;
    std::vector<uint8_t> s;  // the stream

    void raw(const void* p, size_t n) {
        auto* b = static_cast<const uint8_t*>(p);
        s.insert(s.end(), b, b + n);
    }
    void seg(fab::SegType type, uint8_t flags_, const void* fixed, uint16_t fixed_len, uint64_t payload_len,
             uint16_t src_lid, uint32_t src_qpn, uint16_t dst_lid, uint32_t dst_qpn, uint32_t psn, uint64_t offset,
             uint8_t fill) {
        fab::SegHeader h{};
        h.type = uint8_t(type);
        h.flags = flags_;
        h.fixed_len = fixed_len;
        h.payload_len = uint32_t(payload_len);
        h.src_lid = src_lid;
        h.dst_lid = dst_lid;
        h.src_qpn = src_qpn;
        h.dst_qpn = dst_qpn;
        h.psn = psn;
        h.offset = offset;
        raw(&h, sizeof(h));
        if (fixed_len) raw(fixed, fixed_len);
        for (uint64_t i = 0; i < payload_len; ++i) s.push_back(uint8_t(fill + (offset + i) * 7));
    }
    // A request message cut into 64 KiB segments; segments [first, last)
    // only (to interleave messages), all by default.
    // The peer's QP `qpn` is always the same incarnation (connections bind it).
    static uint64_t incarnation_of(uint32_t qpn) { return 0x5eed00000000ull + qpn; }
    void request(Request r, uint8_t fill = 0x30, size_t first = 0, size_t last = ~size_t(0)) {
        if (r.qp_type != IBV_QPT_UD && !r.src_incarnation) r.src_incarnation = incarnation_of(r.sqpn);
        const bool carries = r.opcode == IBV_WR_SEND || r.opcode == IBV_WR_SEND_WITH_IMM ||
                             r.opcode == IBV_WR_RDMA_WRITE || r.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
        const uint16_t len = fab::encode(r, fixed_);
        message(fab::SegType::Request, fixed_, len, carries ? r.length : 0, r.slid,
                r.sqpn, r.dlid, r.dqpn, r.psn, fill, first, last);
    }
    void response(uint16_t src_lid, uint32_t src_qpn, uint16_t dst_lid, uint32_t dst_qpn, Response resp,
                  uint64_t data, uint8_t fill = 0x60) {
        if (resp.syndrome != Syndrome::Drop && !resp.incarnation) resp.incarnation = incarnation_of(src_qpn);
        fab::WireResponse w = fab::encode(resp, data);
        message(fab::SegType::Response, &w, sizeof(w), data, src_lid, src_qpn, dst_lid, dst_qpn, resp.psn, fill, 0,
                ~size_t(0));
    }
    void chunk(uint16_t len, uint8_t act) { chunks.push_back({len, act}); }

    std::vector<uint8_t> bytes() const {
        std::vector<uint8_t> out{flags, uint8_t(chunks.size())};
        for (const Chunk& c : chunks) {
            out.push_back(uint8_t(c.len));
            out.push_back(uint8_t(c.len >> 8));
            out.push_back(c.act);
        }
        out.insert(out.end(), s.begin(), s.end());
        return out;
    }

private:
    uint8_t fixed_[fab::kMaxFixed];
    void message(fab::SegType type, const void* fixed, uint16_t fixed_len, uint64_t total, uint16_t src_lid,
                 uint32_t src_qpn, uint16_t dst_lid, uint32_t dst_qpn, uint32_t psn, uint8_t fill, size_t first,
                 size_t last) {
        uint64_t off = 0;
        size_t i = 0;
        do {
            uint64_t n = std::min<uint64_t>(fab::kMaxSegmentPayload, total - off);
            uint8_t f = (off == 0 ? fab::kSegFirst : 0) | (off + n == total ? fab::kSegLast : 0);
            if (i >= first && i < last)
                seg(type, f, off == 0 ? fixed : nullptr, off == 0 ? fixed_len : 0, n, src_lid, src_qpn, dst_lid,
                    dst_qpn, psn, off, fill);
            off += n;
            ++i;
        } while (off < total);
    }
};

inline int write_all(const char* dir, FabricWorld& w) {
    std::vector<Seed> seeds;
    auto add = [&](const char* name, uint8_t flags = 0) -> Seed& {
        seeds.emplace_back();
        seeds.back().name = name;
        seeds.back().flags = flags;
        return seeds.back();
    };
    // A request of the peer's QP kPeerQpA to a's RC QP.
    auto rc = [&](uint32_t op, uint32_t psn, uint64_t len) {
        Request r;
        r.opcode = op;
        r.qp_type = IBV_QPT_RC;
        r.psn = psn;
        r.slid = kPeerFirst;
        r.sqpn = kPeerQpA;
        r.dlid = kLidA;
        r.dqpn = w.a_rc.qpn;
        r.sl = 2;
        r.length = len;
        return r;
    };
    auto ud = [&](uint32_t qkey, bool grh, uint64_t len) {
        Request r;
        r.opcode = IBV_WR_SEND_WITH_IMM;
        r.qp_type = IBV_QPT_UD;
        r.slid = kPeerFirst;
        r.sqpn = kPeerQpUd;
        r.dlid = kLidA;
        r.dqpn = w.a_ud.qpn;
        r.has_imm = true;
        r.imm = 0x01020304;
        r.qkey = qkey;
        r.length = len;
        if (grh) {
            r.grh = true;
            r.hop_limit = 64;
            r.traffic_class = 3;
            r.flow_label = 0x12345;
            r.sgid[0] = 0xfe;
            r.dgid[0] = 0xfe;
        }
        return r;
    };
    auto ack = [&](uint32_t psn, uint64_t orig = 0) {
        Response r;
        r.syndrome = Syndrome::Ack;
        r.psn = psn;
        r.atomic_orig = orig;
        return r;
    };
    const uint8_t kAllPosts = kPostRead | kPostFaa | kPostCas | kPostSend | kPostWrite | kPostUd;

    {
        Seed& s = add("send_imm");
        Request r = rc(IBV_WR_SEND_WITH_IMM, 0, 100);
        r.has_imm = true;
        r.imm = 0xdeadbeef;
        r.solicited = true;
        s.request(r);
        s.request(rc(IBV_WR_SEND, 1, 0));  // zero length
    }
    add("send_multiseg").request(rc(IBV_WR_SEND, 0, 100000));
    {
        // A SEND and a WRITE whose sender lost its memory under the payload:
        // each ends with an empty segment flagged abort (wire.h kSegAbort).
        Seed& s = add("aborted");
        Request r = rc(IBV_WR_SEND, 0, 100);
        for (int i = 0; i < 2; ++i) {
            r.src_incarnation = Seed::incarnation_of(r.sqpn);
            uint8_t wr[fab::kMaxFixed];
            const uint16_t len = fab::encode(r, wr);
            s.seg(fab::SegType::Request, fab::kSegFirst, wr, len, r.length, r.slid, r.sqpn, r.dlid, r.dqpn,
                  r.psn, 0, 0x30);
            s.seg(fab::SegType::Request, fab::kSegLast | fab::kSegAbort, nullptr, 0, 0, r.slid, r.sqpn, r.dlid,
                  r.dqpn, r.psn, r.length, 0);
            r = rc(IBV_WR_RDMA_WRITE, 1, 5000);
            r.rkey = w.a_remote.rkey;
            r.remote_addr = w.a_remote.addr;
        }
    }
    {
        Seed& s = add("write_multiseg");
        Request r = rc(IBV_WR_RDMA_WRITE, 0, 150000);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr + 1000;
        s.request(r);
        r = rc(IBV_WR_RDMA_WRITE_WITH_IMM, 1, 1000);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr + kRemoteLen - 1000;
        r.has_imm = true;
        r.imm = 7;
        s.request(r, 0x44);
    }
    {
        Seed& s = add("write_chunked");
        Request r = rc(IBV_WR_RDMA_WRITE, 0, 70000);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr;
        s.request(r);
        s.chunk(20, kActRead);                        // mid-header
        s.chunk(120, kActRead | kActPoll);            // mid-fixed part
        s.chunk(30000, kActRead | kActFlush | kActPoll);
        s.chunk(36000, kActRead | kActDrain);         // across the segment boundary
    }
    {
        Seed& s = add("eof_mid_write");
        Request r = rc(IBV_WR_RDMA_WRITE, 0, 150000);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr;
        s.request(r);
        s.chunk(40000, kActRead | kActShut);
    }
    {
        Seed& s = add("eof_mid_send");
        s.request(rc(IBV_WR_SEND, 0, 100000));
        s.chunk(50000, kActRead | kActPoll | kActShut);
    }
    {
        Seed& s = add("read_request");
        Request r = rc(IBV_WR_RDMA_READ, 0, 100000);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr + 8;
        s.request(r);
        r = rc(IBV_WR_RDMA_READ, 1, 0);
        s.request(r);
        r = rc(IBV_WR_RDMA_READ, 0, 16);  // a duplicate: read again
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr;
        s.request(r);
    }
    {
        Seed& s = add("atomics");
        Request r = rc(IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr + 64;
        r.compare_add = 3;
        s.request(r);
        r = rc(IBV_WR_ATOMIC_CMP_AND_SWP, 1, 8);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr + 64;
        r.compare_add = 0xa2a2a2a2a2a2a2a5ull;
        r.swap = 9;
        s.request(r);
        s.request(r);  // a duplicate: the original value replayed
        r = rc(IBV_WR_ATOMIC_FETCH_AND_ADD, 2, 8);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr + 65;  // misaligned
        s.request(r);
    }
    {
        Seed& s = add("ud_datagrams");
        s.request(ud(kQkey, true, 200));
        s.request(ud(kQkey, false, 0));
        s.request(ud(0x999, false, 10));   // wrong qkey: dropped
        s.request(ud(kQkey, false, 4097));  // over the MTU: dropped
        s.request(ud(kQkey, true, 4096));
    }
    {
        Seed& s = add("responses", kAllPosts);
        Response rd = ack(0);
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, rd, 80000);
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, ack(1, 0x77), 0);
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, ack(2, 5), 0);
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, ack(3), 0);
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, ack(4), 0);
    }
    {
        Seed& s = add("response_read_short", kPostRead);
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, ack(0), 100);  // not the READ's length
    }
    {
        Seed& s = add("rnr_then_ack", kPostSend | kPostWrite);
        Response r;
        r.syndrome = Syndrome::RnrNak;
        r.rnr_timer = 1;
        r.psn = 0;
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, r, 0);
        s.chunk(uint16_t(s.s.size()), kActRead | kActPoll | kActClock);
        s.chunk(0, kActPoll | kActFlush | kActDrain);  // the resend, after the RNR timer
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, ack(0), 0);
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, ack(1), 0);
    }
    {
        Seed& s = add("naks", kPostRead | kPostSend);
        Response r;
        r.syndrome = Syndrome::NakSeq;
        r.psn = 0;
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, r, 0);
        s.chunk(uint16_t(s.s.size()), kActRead | kActPoll | kActFlush | kActDrain);
        r.syndrome = Syndrome::NakAccess;
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, r, 0);
    }
    {
        Seed& s = add("timeout_retry", kPostRead | kPostFaa);
        s.chunk(0, kActClock | kActPoll | kActFlush | kActDrain);
        s.chunk(0, kActClock | kActPoll | kActFlush | kActDrain);
        s.response(kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, ack(0), 80000);
    }
    {
        Seed& s = add("interleaved");
        Request big = rc(IBV_WR_SEND, 0, 100000);
        s.request(big, 0x30, 0, 1);
        s.request(ud(kQkey, true, 300));
        s.request(big, 0x30, 1, 2);
        Request r = rc(IBV_WR_RDMA_WRITE, 1, 5000);
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr;
        s.request(r);
    }
    {
        Seed& s = add("attack_bystander");
        Request r;
        r.opcode = IBV_WR_RDMA_WRITE;
        r.qp_type = IBV_QPT_RC;
        r.slid = kPeerFirst + 1;
        r.sqpn = kPeerQpB;
        r.dlid = kLidB;
        r.dqpn = w.b_rc.qpn;
        r.rkey = w.b_private.rkey;
        r.remote_addr = w.b_private.addr;
        r.length = 64;
        s.request(r);
        r.opcode = IBV_WR_SEND;
        s.request(r);
        r.opcode = IBV_WR_RDMA_READ;
        s.request(r);
        r.opcode = IBV_WR_RDMA_WRITE;
        r.rkey = w.a_remote.rkey;  // a's key presented to b
        r.remote_addr = w.a_remote.addr;
        s.request(r);
    }
    {
        Seed& s = add("attack_private");
        Request r = rc(IBV_WR_RDMA_WRITE, 0, 64);
        r.rkey = w.a_private.rkey;
        r.remote_addr = w.a_private.addr;
        s.request(r);
        r = rc(IBV_WR_RDMA_WRITE, 0, 64);  // beyond the MR's end
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr + kRemoteLen - 32;
        s.request(r);
        r.remote_addr = ~0ull - 16;
        s.request(r);
        r.dqpn = w.a_rc2.qpn;  // a QP that grants no remote access
        r.sqpn = kPeerQpA2;
        r.remote_addr = w.a_remote.addr;
        s.request(r);
        r.dqpn = w.a_loc.qpn;  // a QP connected to guest b
        s.request(r);
    }
    auto bad_header = [&](const char* name, uint8_t type, uint8_t flags, uint16_t fixed, uint32_t payload,
                          uint16_t src_lid) {
        Seed& s = add(name);
        fab::SegHeader h{};
        h.type = type;
        h.flags = flags;
        h.fixed_len = fixed;
        h.payload_len = payload;
        h.src_lid = src_lid;
        h.dst_lid = kLidA;
        s.raw(&h, sizeof(h));
        std::vector<uint8_t> rest(fixed + std::min<uint32_t>(payload, 256), 0);
        s.raw(rest.data(), rest.size());
    };
    const uint8_t both = fab::kSegFirst | fab::kSegLast;
    bad_header("bad_type", 9, both, 0, 0, kPeerFirst);
    bad_header("bad_payload_len", 1, both, 112, 65537, kPeerFirst);
    bad_header("bad_fixed_len", 1, both, 24, 0, kPeerFirst);
    bad_header("bad_continuation", 1, fab::kSegLast, 0, 10, kPeerFirst);
    bad_header("error_segment", 3, both, 0, 20, kPeerFirst);
    {
        Seed& s = add("bad_src_lid");
        Request r = rc(IBV_WR_RDMA_WRITE, 0, 16);
        r.slid = kLidB;  // a LID of this shim
        r.rkey = w.a_remote.rkey;
        r.remote_addr = w.a_remote.addr;
        s.request(r);
    }
    {
        // Flags that name an extension the fixed part does not have.
        Seed& s = add("bad_request_flags");
        Request r = rc(IBV_WR_SEND, 0, 16);
        uint8_t wr[fab::kMaxFixed];
        const uint16_t len = fab::encode(r, wr);
        wr[offsetof(fab::WireRequest, flags)] |= fab::kReqAddress;
        s.seg(fab::SegType::Request, both, wr, len, 16, kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, 0, 0, 1);
    }
    {
        Seed& s = add("bad_short_message");
        Request r = rc(IBV_WR_SEND, 0, 100);
        uint8_t wr[fab::kMaxFixed];
        const uint16_t len = fab::encode(r, wr);
        s.seg(fab::SegType::Request, both, wr, len, 50, kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, 0, 0, 1);
    }
    {
        Seed& s = add("bad_new_before_end");
        Request big = rc(IBV_WR_SEND, 0, 100000);
        s.request(big, 0x30, 0, 1);
        s.request(rc(IBV_WR_SEND, 1, 10));
    }
    {
        Seed& s = add("bad_nak_with_data", kPostRead);
        Response r;
        r.syndrome = Syndrome::NakAccess;
        fab::WireResponse wr = fab::encode(r, 10);
        s.seg(fab::SegType::Response, both, &wr, sizeof(wr), 10, kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, 0, 0, 1);
    }
    {
        Seed& s = add("bad_request_opcode");
        Request r = rc(IBV_WR_SEND, 0, 0);
        uint8_t wr[fab::kMaxFixed];
        const uint16_t len = fab::encode(r, wr);
        const uint16_t bad_opcode = 99;
        std::memcpy(wr + offsetof(fab::WireRequest, opcode), &bad_opcode, 2);
        s.seg(fab::SegType::Request, both, wr, len, 0, kPeerFirst, kPeerQpA, kLidA, w.a_rc.qpn, 0, 0, 1);
    }
    {
        Seed& s = add("raw_bad_hello", kRaw);
        fab::Hello h = ft::make_hello(kPeerFirst, kPeerLast);
        h.magic = 1;
        s.raw(&h, sizeof(h));
    }
    {
        Seed& s = add("raw_wrong_mode", kRaw);
        fab::Hello h = ft::make_hello(kPeerFirst, kPeerLast, 0x5a, fab::CryptoMode::Integrity);
        s.raw(&h, sizeof(h));
    }
    {
        Seed& s = add("raw_bad_lids", kRaw);
        fab::Hello h = ft::make_hello(0, 5);
        s.raw(&h, sizeof(h));
    }

    int n = 0;
    for (const Seed& s : seeds) {
        std::string path = std::string(dir) + "/" + s.name;
        FILE* f = std::fopen(path.c_str(), "wb");
        if (!f) return -1;
        std::vector<uint8_t> b = s.bytes();
        std::fwrite(b.data(), 1, b.size(), f);
        std::fclose(f);
        ++n;
    }
    return n;
}

}  // namespace fabric_seeds
