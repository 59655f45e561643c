// libFuzzer target: the WQE parser and executor of the local transport.
// The input is a sequence of actions by guest a: send WQEs (any opcode,
// flags, SGE count, inline length, address, lkey, rkey, AH, QPN, qkey) on
// its RC, loopback, UD and SRQ-backed QPs, receive WQEs, engine passes,
// clock jumps (RNR and retry timers), QP state changes, MR and QP destroy
// and re-create while WQEs are in flight, CQ polling, and guest b dying.
#include "fuzz_common.h"

using namespace vrdma::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    quiet_logs();
    g_now = 1'000'000'000;
    World w;
    Input in(data, size);
    for (int steps = 0; !in.empty() && steps < 256; ++steps) {
        if (!w.a.alive()) break;
        switch (in.pick(12)) {
        case 0:
        case 1:
        case 2:
            w.post_send(in, *w.a_qp(in));
            break;
        case 3:
            w.post_recv(in);
            break;
        case 4:
            w.run(1 + in.pick(3));
            break;
        case 5:
            g_now += uint64_t(in.u16()) * 100'000;
            w.run(1);
            break;
        case 6: {  // state change of one of a's QPs
            QpView* q = w.a_qp(in);
            abi::QpAttr at{};
            uint8_t k = in.u8();
            if (k % 4 == 0) {
                at.qp_state = IBV_QPS_ERR;
                w.a.modify(q->handle, IBV_QP_STATE, at);
            } else if (k % 4 == 1) {
                at.qp_state = IBV_QPS_RESET;
                w.a.modify(q->handle, IBV_QP_STATE, at);
                if (q == &w.a_rc) w.a.connect(*q, 2, w.b_rc.qpn, 0, k >> 5);
                else if (q == &w.a_loop) w.a.connect(*q, 1, w.a_loop.qpn, 0, k >> 5);
                else if (q == &w.a_ud) w.a.connect(*q, 0, 0, 0x1111);
                else w.a.connect(*q, 2, w.b_rc2.qpn, 0, k >> 5);
            } else if (k % 4 == 2) {
                at.qp_state = IBV_QPS_SQD;
                w.a.modify(q->handle, IBV_QP_STATE | (k & 0x10 ? IBV_QP_EN_SQD_ASYNC_NOTIFY : 0), at);
            } else {
                at.qp_state = IBV_QPS_RTS;
                w.a.modify(q->handle, IBV_QP_STATE, at);
            }
            break;
        }
        case 7: {  // deregister an MR of a with WQEs in flight, register it again
            MrInfo& m = in.u8() & 1 ? w.a_local : w.a_remote;
            w.a.cmd(abi::CmdOp::DeregMr, abi::CmdHandleReq{m.handle});
            if (in.u8() & 1) {
                auto r = w.a.cmd(abi::CmdOp::RegMr, abi::CmdRegMrReq{w.a_pd, uint32_t(in.u8() & 0xf), m.addr, m.len, m.addr});
                if (r.status == 0) {
                    auto resp = r.as<abi::CmdRegMrResp>();
                    m.handle = resp.mr_handle;
                    m.lkey = resp.lkey;
                    m.rkey = resp.rkey;
                }
            }
            break;
        }
        case 8: {  // destroy a QP with WQEs in flight
            QpView* q = w.a_qp(in);
            w.a.cmd(abi::CmdOp::DestroyQp, abi::CmdHandleReq{q->handle});
            break;
        }
        case 9:
            w.poll_all(in);
            break;
        case 10:
            if (!w.b_gone && in.u8() == 0x42) {  // b's process dies
                w.eng.detach(w.b.ctx_id());
                w.b_gone = true;
            }
            break;
        default: {  // raw bytes over a send WQE slot, then publish it
            QpView* q = w.a_qp(in);
            uint8_t* slot = w.a.wqe_slot(q->sq, q->sq.prod);
            uint32_t n = std::min<uint32_t>(in.u8() * 2, q->sq.stride);
            in.bytes(slot, n);
            w.a.publish(q->sq);
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
