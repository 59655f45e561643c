// The multicast groups of one shim (docs/protocol.md "Multicast"): which UD
// QPs of its guests are attached to which MGID (ibv_attach_mcast).
//
// A group is named by its MGID. Its MLID is a function of the MGID
// (mlid_of), so every shim of a fabric gives a group the same MLID with no
// subnet manager to agree with; two MGIDs may share an MLID, as IB allows,
// and a datagram with a GRH reaches only the group its destination GID
// names.
//
// Threads: control commands attach and detach (any worker) under a mutex;
// each worker's sends read an immutable view, swapped in whole on every
// change and fetched again only when the generation moved, so a multicast
// send takes no lock unless membership changed since that worker's last.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace vrdma::shim {

// The destination QPN of every multicast datagram.
constexpr uint32_t kMulticastQpn = 0xffffff;
// Multicast LIDs are 0xc000..0xfffe (0xffff is the permissive LID).
constexpr bool is_multicast_lid(uint16_t lid) { return lid >= 0xc000 && lid != 0xffff; }
constexpr bool is_multicast_gid(const uint8_t gid[16]) { return gid[0] == 0xff; }
// The MLID of a group: a hash of its MGID into the multicast LIDs.
uint16_t mlid_of(const uint8_t mgid[16]);

struct McastMember {
    uint16_t lid;  // the guest's
    uint32_t qpn;
};

struct McastGroup {
    uint8_t mgid[16];
    uint16_t mlid;
    std::vector<McastMember> members;
};

struct McastView {
    std::vector<std::shared_ptr<const McastGroup>> groups;
    // Calls f(member) for each QP a datagram to multicast LID `dlid`
    // reaches: the members of the group `dgid` names (with a GRH, whatever
    // the LID: applications that attach by GID pick their own MLIDs), or
    // of every group of MLID `dlid` (without one).
    template <typename F>
    void for_each_member(uint16_t dlid, const uint8_t* dgid, F&& f) const {
        for (const auto& g : groups) {
            if (dgid ? !same_gid(g->mgid, dgid) : g->mlid != dlid) continue;
            for (const McastMember& m : g->members) f(m);
        }
    }
    static bool same_gid(const uint8_t* a, const uint8_t* b);
};

class MulticastGroups {
public:
    // Limits. On the shim: groups, and QPs in one group. Per guest (its
    // LID): groups it opened (was the first member of), QPs of its in one
    // group, and attachments in all. No guest can take the whole shim's
    // groups, or fill a group another guest uses. The device reports
    // kMaxGroups, kMaxQpsPerGroupPerGuest and kMaxAttachPerGuest as
    // max_mcast_grp, max_mcast_qp_attach and max_total_mcast_qp_attach.
    static constexpr uint32_t kMaxGroups = 1024;
    static constexpr uint32_t kMaxQpsPerGroup = 256;
    static constexpr uint32_t kMaxGroupsPerGuest = 256;
    static constexpr uint32_t kMaxQpsPerGroupPerGuest = 64;
    static constexpr uint32_t kMaxAttachPerGuest = 1024;

    MulticastGroups();
    // 0; EINVAL: not a multicast GID; ENOMEM: a limit. Attaching a QP that
    // is attached already succeeds and changes nothing.
    int attach(uint16_t lid, uint32_t qpn, const uint8_t mgid[16]);
    // 0; EINVAL: the QP is not attached to that group.
    int detach(uint16_t lid, uint32_t qpn, const uint8_t mgid[16]);
    // The QP is gone: it leaves every group.
    void detach_all(uint32_t qpn);

    // Changes with every attach and detach.
    uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
    std::shared_ptr<const McastView> view() const;

private:
    struct Group {
        std::shared_ptr<const McastGroup> data;  // what views hold: replaced, never changed
        uint16_t opener = 0;                     // the guest whose first member opened it
    };
    struct GuestCount {
        uint32_t opened = 0, attached = 0;
    };
    // Under mutex_: group `i` becomes `g` (none: it goes), and a new view.
    void replace(size_t i, std::shared_ptr<const McastGroup> g);
    void publish();
    // Under mutex_: member `member` of group `group` leaves (the group with
    // it if it was the last), and its guest's counts go down.
    void remove_member(size_t group, size_t member);
    void count_down(uint16_t lid);

    mutable std::mutex mutex_;
    std::vector<Group> groups_;
    std::unordered_map<uint16_t, GuestCount> guests_;
    std::shared_ptr<const McastView> view_;
    std::atomic<uint64_t> generation_{1};
    std::atomic<bool> any_{false};  // detach_all's fast way out: no group at all
};

}  // namespace vrdma::shim
