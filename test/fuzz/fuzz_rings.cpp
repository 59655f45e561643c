// libFuzzer target: ring index and doorbell handling. Guest a writes any
// value into the producer indices of its send queues, receive queues and
// SRQ, the consumer indices of its CQs, its cmd_producer and doorbell
// (past the ring, wrapped, stale, huge), between well-formed WQEs and
// commands, and the shim runs. b's CQ may overrun (b does not poll).
#include "fuzz_common.h"

using namespace vrdma::fuzz;

namespace {

uint32_t index_value(Input& in, uint32_t cur, uint32_t entries) {
    switch (in.pick(9)) {
    case 0: return cur;
    case 1: return cur + 1;
    case 2: return cur - 1;
    case 3: return cur + entries;
    case 4: return cur + entries + 1;
    case 5: return 2 * entries;
    case 6: return 0xffffffffu;
    case 7: return (cur + in.u8()) & (2 * entries - 1);
    default: return in.u32();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    quiet_logs();
    g_now = 1'000'000'000;
    World w;
    Input in(data, size);
    for (int steps = 0; !in.empty() && steps < 256; ++steps) {
        if (!w.a.alive()) break;
        switch (in.pick(10)) {
        case 0: {  // a producer index of one of a's work queues
            QpView* q = w.a_qp(in);
            WqView* wq = in.u8() & 1 && !q->srq ? &q->rq : &q->sq;
            if (in.u8() & 1) wq = &w.a.srq_ring;
            uint32_t v = index_value(in, wq->prod, wq->entries);
            w.a.ring_header(wq->ring)->producer.store(v);
            if (in.u8() & 1) wq->prod = v;  // the provider believes it too
            w.a.announce(*wq);  // its work bit (the doorbell for the SRQ)
            break;
        }
        case 1: {  // a CQ consumer index
            CqView& cq = in.u8() & 1 ? w.a_cq : w.a_cq2;
            uint32_t v = index_value(in, cq.cons, cq.entries);
            reinterpret_cast<abi::RingHeader*>(w.a.at(cq.ring))->consumer.store(v);
            if (in.u8() & 1) cq.cons = v;
            break;
        }
        case 2: {  // cmd_producer and the command ring
            uint32_t v = index_value(in, w.a.cmd_producer(), abi::kCmdSlots);
            uint32_t n = in.pick(4);
            std::vector<std::pair<uint32_t, std::vector<uint8_t>>> recs;
            for (uint32_t i = 0; i < n; ++i) {
                std::vector<uint8_t> req(in.u8() % 64);
                in.bytes(req.data(), req.size());
                recs.emplace_back(in.pick(24), std::move(req));
            }
            if (in.u8() & 1) {
                w.a.cb()->cmd_producer.store(v);
                w.a.cb()->doorbell.fetch_add(1);
                w.run(1);
            } else {
                w.a.cmds(recs, n);
            }
            break;
        }
        case 3:  // the doorbell alone, any value
            w.a.cb()->doorbell.store(in.u32());
            break;
        case 4: {  // a well-formed SEND or WRITE to b
            QpView* q = in.u8() & 1 ? &w.a_rc : &w.a_loop;
            abi::SendWqe wq{};
            wq.wr_id = in.u32();
            wq.opcode = in.u8() & 1 ? IBV_WR_SEND : IBV_WR_RDMA_WRITE;
            wq.send_flags = in.u8() & 1 ? IBV_SEND_SIGNALED : 0;
            wq.num_sge = 1;
            wq.remote_addr = (q == &w.a_rc ? w.b_granted.addr : w.a_remote.addr) + in.u8();
            wq.rkey = q == &w.a_rc ? w.b_granted.rkey : w.a_remote.rkey;
            abi::Sge s{w.a_local.addr + in.u8(), uint32_t(in.u8()) * 8, w.a_local.lkey};
            w.a.post_send(q->sq, wq, {&s, 1});
            break;
        }
        case 5:
            w.post_recv(in);
            break;
        case 6:
            w.run(1 + in.pick(3));
            break;
        case 7:
            if (in.u8() & 1) w.poll_all(in);
            else g_now += uint64_t(in.u16()) * 100'000;
            break;
        case 8: {  // the ring header's other words (the shim's own index, padding)
            QpView* q = w.a_qp(in);
            w.a.ring_header(q->sq.ring)->consumer.store(in.u32());
            break;
        }
        default:
            w.post_send(in, *w.a_qp(in));
            break;
        }
    }
    w.run(2);
    g_now += 10'000'000'000ull;
    w.run(4);
    w.check();
    return 0;
}
