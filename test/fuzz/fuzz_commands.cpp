// libFuzzer target: every control command record. Guest a issues batches of
// commands (any op, including unknown ones) whose fields come from the
// input: handles of its own live, freed or foreign objects, of other types
// and of guest b, made-up handles; ring addresses inside, across and outside
// its memory; any sizes, counts, masks and attributes. It can also write its
// scratch memory (where rings of the objects it creates live), so that new
// QPs and CQs carry work. Every record of a well-formed batch must complete.
#include "fuzz_common.h"

using namespace vrdma::fuzz;

namespace {

struct Pool {
    std::vector<uint32_t> h;
    uint32_t pick(Input& in) {
        uint8_t v = in.u8();
        if (v < 200 && !h.empty()) return h[v % h.size()];
        if (v < 230) return make_handle(HandleType(1 + v % 6), in.u8(), in.u8() % 8);
        if (v < 240) return 0;
        return in.u32();
    }
};

uint32_t pow2ish(Input& in, uint32_t max_shift) {
    uint8_t v = in.u8();
    if (v < 200) return 1u << (v % (max_shift + 1));
    if (v < 230) return (1u << (v % (max_shift + 1))) + 1;
    return in.u32();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    quiet_logs();
    g_now = 1'000'000'000;
    World w;
    constexpr uint64_t kScratch = 512 << 10;
    const uint64_t scratch = w.a.alloc(kScratch, 4096);
    Pool pool;
    for (uint32_t h : {w.a_pd, w.a_local.handle, w.a_remote.handle, w.a_cq.handle, w.a_cq2.handle, w.a_rc.handle,
                       w.a_loop.handle, w.a_ud.handle, w.a_srq_qp.handle, w.a_srq, w.a_ah_b, w.a_ah_c, w.b_pd,
                       w.b_granted.handle, w.b_cq.handle, w.b_rc.handle})
        pool.h.push_back(h);

    Input in(data, size);
    auto gva = [&](Input& in) -> uint64_t {
        uint8_t v = in.u8();
        if (v < 160) return scratch + (uint64_t(in.u16()) % (kScratch / 64)) * 64;
        if (v < 200) return w.addr(in);
        if (v < 220) return scratch + in.u32();
        return in.u64();
    };
    for (int steps = 0; !in.empty() && steps < 128; ++steps) {
        if (!w.a.alive()) break;
        uint8_t action = in.u8();
        if (action < 24) {  // write scratch memory (rings of created objects)
            uint64_t off = in.u32() % kScratch;
            uint32_t n = std::min<uint64_t>(in.u8(), kScratch - off);
            in.bytes(w.a.at(scratch + off), n);
            w.a.cb()->doorbell.fetch_add(1);
            continue;
        }
        if (action < 40) {
            w.run(1 + in.pick(2));
            continue;
        }
        if (action < 48) {
            w.post_send(in, *w.a_qp(in));
            continue;
        }
        if (action < 52) {
            g_now += uint64_t(in.u16()) * 100'000;
            continue;
        }
        const uint32_t n = 1 + in.pick(4);
        std::vector<std::pair<uint32_t, std::vector<uint8_t>>> recs;
        for (uint32_t i = 0; i < n; ++i) {
            uint8_t o = in.u8();
            uint32_t op = o < 230 ? 1 + o % (uint32_t(abi::CmdOp::kMax) - 1) : (o < 250 ? o - 230 : in.u32());
            std::vector<uint8_t> req(abi::kCmdReqBytes, 0);
            auto put = [&](const auto& t) { std::memcpy(req.data(), &t, sizeof(t)); };
            switch (abi::CmdOp(op)) {
            case abi::CmdOp::QueryPort: put(abi::CmdQueryPortReq{uint32_t(in.u8() & 3)}); break;
            case abi::CmdOp::DeallocPd:
            case abi::CmdOp::DeregMr:
            case abi::CmdOp::DestroyCq:
            case abi::CmdOp::DestroyQp:
            case abi::CmdOp::DestroySrq:
            case abi::CmdOp::DestroyAh:
            case abi::CmdOp::QueryQp:
            case abi::CmdOp::QuerySrq: put(abi::CmdHandleReq{pool.pick(in)}); break;
            case abi::CmdOp::RegMr: {
                abi::CmdRegMrReq r{};
                r.pd_handle = pool.pick(in);
                uint8_t acc = in.u8();
                r.access = acc < 240 ? acc & 0x1f : in.u32();
                r.addr = gva(in);
                uint8_t l = in.u8();
                r.length = l < 200 ? uint64_t(in.u16()) * (l & 1 ? 64 : 1) : in.u64();
                // Mostly the address itself; zero-based (device memory), or any.
                const uint8_t v = in.u8();
                r.iova = v < 200 ? r.addr : v < 230 ? 0 : in.u64();
                if (v >= 200 && v < 230) r.access |= IBV_ACCESS_ZERO_BASED;
                put(r);
                break;
            }
            case abi::CmdOp::CreateCq: {
                abi::CmdCreateCqReq r{};
                r.ring_gva = gva(in);
                r.user_handle = in.u64();
                r.entries = pow2ish(in, 12);
                r.channel_id = in.u8() < 230 ? 0 : in.u32();
                r.comp_vector = in.u8() < 230 ? 0 : in.u8();
                put(r);
                break;
            }
            case abi::CmdOp::CreateQp: {
                abi::CmdCreateQpReq r{};
                r.sq_gva = gva(in);
                r.rq_gva = in.u8() < 200 ? gva(in) : 0;
                r.user_handle = in.u64();
                r.pd_handle = pool.pick(in);
                uint8_t t = in.u8();
                r.qp_type = t < 120 ? IBV_QPT_RC : t < 240 ? IBV_QPT_UD : in.u32();
                r.send_cq_handle = pool.pick(in);
                r.recv_cq_handle = pool.pick(in);
                r.srq_handle = in.u8() < 200 ? 0 : pool.pick(in);
                r.sq_entries = pow2ish(in, 8);
                r.sq_stride = pow2ish(in, 12);
                r.rq_entries = pow2ish(in, 8);
                r.rq_stride = pow2ish(in, 10);
                r.max_send_sge = in.u8() % 40;
                r.max_recv_sge = in.u8() % 40;
                r.max_inline_data = in.u16() % 1100;
                r.sq_sig_all = in.u8() % 3;
                put(r);
                break;
            }
            case abi::CmdOp::ModifyQp: {
                abi::CmdModifyQpReq r{};
                r.qp_handle = pool.pick(in);
                uint8_t m = in.u8();
                r.attr_mask = m < 200 ? (IBV_QP_STATE | (in.u32() & 0x1fffff)) : in.u32();
                in.bytes(&r.attr, sizeof(r.attr));
                if (in.u8() < 200) r.attr.qp_state %= 7;
                if (in.u8() < 128) r.attr.ah.dlid = 1 + in.pick(3);
                if (in.u8() < 128) r.attr.dest_qp_num = w.qpn(in);
                if (in.u8() < 128) r.attr.port_num = 1;
                put(r);
                break;
            }
            case abi::CmdOp::CreateSrq: {
                abi::CmdCreateSrqReq r{};
                r.ring_gva = gva(in);
                r.user_handle = in.u64();
                r.pd_handle = pool.pick(in);
                r.entries = pow2ish(in, 8);
                r.stride = pow2ish(in, 10);
                r.max_sge = in.u8() % 40;
                r.srq_limit = in.u16();
                put(r);
                break;
            }
            case abi::CmdOp::ResizeCq: {
                abi::CmdResizeCqReq r{};
                r.ring_gva = gva(in);
                r.cq_handle = pool.pick(in);
                r.entries = pow2ish(in, 12);
                r.cqe = in.u8() < 200 ? r.entries - 1 : in.u32();
                put(r);
                break;
            }
            case abi::CmdOp::ReregMr: {
                abi::CmdReregMrReq r{};
                r.mr_handle = pool.pick(in);
                r.flags = in.u8() & 15;
                r.pd_handle = pool.pick(in);
                uint8_t acc = in.u8();
                r.access = acc < 240 ? acc & 0x1f : in.u32();
                r.addr = gva(in);
                uint8_t l = in.u8();
                r.length = l < 200 ? uint64_t(in.u16()) * (l & 1 ? 64 : 1) : in.u64();
                put(r);
                break;
            }
            case abi::CmdOp::ModifySrq:
                put(abi::CmdModifySrqReq{pool.pick(in), in.u8() & 7u, in.u16(), in.u16()});
                break;
            case abi::CmdOp::CreateAh: {
                abi::CmdCreateAhReq r{};
                r.pd_handle = pool.pick(in);
                in.bytes(&r.attr, sizeof(r.attr));
                if (in.u8() < 200) {
                    r.attr.dlid = 1 + in.pick(4);
                    r.attr.port_num = 1;
                    r.attr.is_global &= 1;
                    r.attr.sl &= 15;
                }
                put(r);
                break;
            }
            default: {  // QueryDevice, unknown ops: raw bytes
                uint32_t k = in.u8() % abi::kCmdReqBytes;
                in.bytes(req.data(), k);
                break;
            }
            }
            if (in.u8() == 0xee) {  // and a few raw bytes over it
                uint32_t off = in.u8() % abi::kCmdReqBytes;
                uint32_t k = std::min<uint32_t>(in.u8() % 16, abi::kCmdReqBytes - off);
                in.bytes(req.data() + off, k);
            }
            recs.emplace_back(op, std::move(req));
        }
        auto res = w.a.cmds(recs, n);
        if (!w.a.alive()) break;
        for (uint32_t i = 0; i < n; ++i) {
            if (res[i].status < 0) violation("a command of a well-formed batch was not completed");
            if (res[i].status != 0) continue;
            switch (abi::CmdOp(recs[i].first)) {
            case abi::CmdOp::AllocPd:
            case abi::CmdOp::RegMr:
            case abi::CmdOp::CreateCq:
            case abi::CmdOp::CreateQp:
            case abi::CmdOp::CreateSrq:
            case abi::CmdOp::CreateAh: {
                uint32_t h;
                std::memcpy(&h, res[i].resp, 4);
                if (pool.h.size() < 64) pool.h.push_back(h);
                break;
            }
            default:
                break;
            }
        }
    }
    w.run(2);
    g_now += 10'000'000'000ull;
    w.run(4);
    w.check();
    return 0;
}
