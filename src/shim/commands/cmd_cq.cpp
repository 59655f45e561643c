// CreateCq, DestroyCq.
#include <cerrno>

#include "commands.h"
#include "vrdma/ring.h"

namespace vrdma::shim {

int cmd_create_cq(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdCreateCqReq>(req);
    if (!is_pow2(r.entries) || r.entries > abi::kMaxCqEntries || r.entries - 1 > ctx.quotas().max_cqe)
        return EINVAL;
    if (r.comp_vector >= abi::kCompVectors) return EINVAL;
    HostRange ring;
    if (int err = map_ring(ctx, r.ring_gva, abi::cq_ring_bytes(r.entries), ring)) return err;
    if (r.channel_id && !ctx.has_channel(r.channel_id)) return EINVAL;
    PendingCharges charge(ctx);
    if (!charge.take(Res::Cq, 1, "CreateCq")) return ENOMEM;
    auto cq = std::make_unique<Cq>();
    cq->ring = reinterpret_cast<abi::RingHeader*>(ring.host);
    cq->notify = reinterpret_cast<abi::CqNotify*>(ring.host + sizeof(abi::RingHeader));
    cq->slots = reinterpret_cast<abi::Cqe*>(ring.host + abi::cq_slots_offset());
    cq->entries = r.entries;
    cq->user_handle = r.user_handle;
    cq->channel_id = r.channel_id;
    cq->keep = std::move(ring.keepalive);
    cq->last_arm_seq = cq->notify->arm_seq.load(std::memory_order_acquire);
    cq->ring->producer.store(0, std::memory_order_release);
    uint32_t h = ctx.cqs.insert(std::move(cq));
    if (!h) return ENOMEM;
    charge.keep();
    store_resp(resp, abi::CmdCreateCqResp{h});
    return 0;
}

int cmd_destroy_cq(Engine&, Context& ctx, const uint8_t* req, uint8_t* resp) {
    auto r = load_req<abi::CmdHandleReq>(req);
    Cq* cq = ctx.cqs.get(r.handle);
    if (!cq) return ENOENT;
    if (cq->users) return EBUSY;
    store_resp(resp, abi::CmdDestroyResp{cq->comp_events, cq->async_events});
    ctx.cqs.erase(r.handle);
    ctx.charges.give(Res::Cq, 1);
    return 0;
}

}  // namespace vrdma::shim
