// Multicast joins (rdma_join_multicast, rdma_leave_multicast): the CM names
// the group and hands the guest its address; the QP's membership is the
// data path's (ibv_attach_mcast, which librdmacm calls on the join's event,
// and multicast_groups.h). With no subnet manager to ask, a join succeeds
// at once: the MGID is the IP group's (ip_address.h), the MLID the one
// every shim derives from it (mlid_of), and the Q_Key the id's.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>

#include "cm_service.h"
#include "multicast_groups.h"

namespace vrdma::shim::cm {

int CmService::join(Channel& ch, uint32_t handle, const void* addr, size_t addr_len, uint64_t uid,
                    uint32_t flags, std::vector<uint8_t>& out) {
    Id* id = find(ch, handle);
    if (!id) return ENOENT;
    if (flags >= RDMA_MC_JOIN_FLAG_RESERVED) return EINVAL;
    Endpoint group;
    if (!endpoint_from_sockaddr(addr, addr_len, group)) return EINVAL;
    // As the kernel: an id with an address of its guest (bound to one, or
    // resolved), of a port space with UD QPs.
    const bool has_device = id->state == State::AddrResolved ||
                            (id->state == State::Bound && !id->src.ip.is_any() && id->src.ip.family != AF_UNSPEC);
    if (!has_device || id->qp_type != IBV_QPT_UD) return EINVAL;
    if (guest_joins_[ch.guest] >= kMaxJoins) return ENOMEM;

    while (!next_join_ || joins_.count(next_join_)) ++next_join_;
    Join& j = joins_[next_join_++];
    j.handle = next_join_ - 1;
    j.id = handle;
    j.guest = ch.guest;
    j.uid = uid;
    const CmGuest& guest = guests_.at(ch.guest);
    if (!multicast_gid(group.ip, id->ps == RDMA_PS_UDP, guest.pkey, j.mgid)) {
        // The wildcard: a group of the shim's own making (the kernel's SA
        // would assign one), named by the guest's LID and the join.
        const uint8_t head[] = {0xff, 0x12, 0xa0, 0x1b, uint8_t(guest.pkey >> 8), uint8_t(guest.pkey)};
        std::memcpy(j.mgid, head, sizeof(head));
        const uint16_t lid = guest.lid;
        j.mgid[8] = uint8_t(lid >> 8);
        j.mgid[9] = uint8_t(lid);
        for (int i = 0; i < 4; ++i) j.mgid[12 + i] = uint8_t(j.handle >> (24 - 8 * i));
    }
    ++guest_joins_[ch.guest];
    id->joins.push_back(j.handle);

    Event& e = queue_event(*id, kMulticastJoin, 0);
    e.join = j.handle;
    e.resp.uid = uid;
    e.resp.id = j.handle;
    rdma_ucm_ud_param& ud = e.resp.param.ud;
    ud.qp_num = kMulticastQpn;
    ud.qkey = id->qkey;
    ud.ah_attr.dlid = mlid_of(j.mgid);
    ud.ah_attr.port_num = 1;
    ud.ah_attr.is_global = 1;
    std::memcpy(ud.ah_attr.grh.dgid, j.mgid, 16);
    ud.ah_attr.grh.hop_limit = 1;

    rdma_ucm_create_id_resp resp{};
    resp.id = j.handle;
    out.resize(sizeof(resp));
    std::memcpy(out.data(), &resp, sizeof(resp));
    return 0;
}

int CmService::leave(Channel& ch, uint32_t handle, std::vector<uint8_t>& out) {
    auto it = joins_.find(handle);
    if (it == joins_.end()) return ENOENT;
    Id* id = find(ch, it->second.id);
    if (!id) return EINVAL;  // another channel's join, as the kernel answers
    // Its events not yet read go, as in the kernel; the count of those
    // read tells librdmacm how many acknowledgements to wait for.
    std::deque<Event> keep;
    for (Event& e : ch.events) {
        if (e.join == handle)
            take_byte(ch);
        else
            keep.push_back(e);
    }
    ch.events.swap(keep);
    rdma_ucm_destroy_id_resp resp{};
    resp.events_reported = it->second.events_reported;
    --guest_joins_[it->second.guest];
    std::erase(id->joins, handle);
    joins_.erase(it);
    out.resize(sizeof(resp));
    std::memcpy(out.data(), &resp, sizeof(resp));
    return 0;
}

void CmService::drop_joins(uint32_t id) {
    Id* idp = id_of(id);
    if (!idp) return;
    for (uint32_t h : idp->joins) {
        auto it = joins_.find(h);
        if (it == joins_.end()) continue;
        --guest_joins_[it->second.guest];
        joins_.erase(it);
    }
    idp->joins.clear();
}

}  // namespace vrdma::shim::cm
