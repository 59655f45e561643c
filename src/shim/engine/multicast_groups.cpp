#include "multicast_groups.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace vrdma::shim {

uint16_t mlid_of(const uint8_t mgid[16]) {
    // FNV-1a over the MGID, folded into 0xc001..0xfffe (0xc000 is left out
    // as a reserved-looking value some tools print specially).
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; ++i) h = (h ^ mgid[i]) * 16777619u;
    return uint16_t(0xc001 + h % (0xfffe - 0xc001 + 1));
}

bool McastView::same_gid(const uint8_t* a, const uint8_t* b) { return std::memcmp(a, b, 16) == 0; }

MulticastGroups::MulticastGroups() : view_(std::make_shared<McastView>()) {}

std::shared_ptr<const McastView> MulticastGroups::view() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return view_;
}

// A change copies one group's members (at most kMaxQpsPerGroup) and the
// list of group pointers (at most kMaxGroups), never every member.
void MulticastGroups::publish() {
    auto v = std::make_shared<McastView>();
    v->groups.reserve(groups_.size());
    for (const Group& g : groups_) v->groups.push_back(g.data);
    view_ = std::move(v);
    any_.store(!groups_.empty(), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_acq_rel);
}

void MulticastGroups::replace(size_t i, std::shared_ptr<const McastGroup> g) {
    if (g) {
        groups_[i].data = std::move(g);
    } else {
        if (auto it = guests_.find(groups_[i].opener); it != guests_.end() && it->second.opened) --it->second.opened;
        groups_.erase(groups_.begin() + std::ptrdiff_t(i));
    }
}

void MulticastGroups::remove_member(size_t group, size_t member) {
    const McastGroup& old = *groups_[group].data;
    const uint16_t lid = old.members[member].lid;
    std::shared_ptr<McastGroup> g;  // none: the last member leaves, and the group goes
    if (old.members.size() > 1) {
        g = std::make_shared<McastGroup>(old);
        g->members.erase(g->members.begin() + std::ptrdiff_t(member));
    }
    replace(group, std::move(g));
    count_down(lid);
}

void MulticastGroups::count_down(uint16_t lid) {
    auto it = guests_.find(lid);
    if (it == guests_.end()) return;
    if (it->second.attached) --it->second.attached;
    if (!it->second.attached && !it->second.opened) guests_.erase(it);
}

int MulticastGroups::attach(uint16_t lid, uint32_t qpn, const uint8_t mgid[16]) {
    if (!is_multicast_gid(mgid)) return EINVAL;
    std::lock_guard<std::mutex> lock(mutex_);
    GuestCount& mine = guests_[lid];
    size_t at = groups_.size();
    for (size_t i = 0; i < groups_.size(); ++i)
        if (McastView::same_gid(groups_[i].data->mgid, mgid)) at = i;
    auto g = std::make_shared<McastGroup>();
    if (at < groups_.size()) {
        const McastGroup& old = *groups_[at].data;
        uint32_t of_guest = 0;
        for (const McastMember& m : old.members) {
            if (m.qpn == qpn) return 0;
            of_guest += m.lid == lid;
        }
        if (old.members.size() >= kMaxQpsPerGroup || of_guest >= kMaxQpsPerGroupPerGuest) return ENOMEM;
        *g = old;
    } else {
        if (groups_.size() >= kMaxGroups || mine.opened >= kMaxGroupsPerGuest) return ENOMEM;
        std::memcpy(g->mgid, mgid, 16);
        g->mlid = mlid_of(mgid);
    }
    if (mine.attached >= kMaxAttachPerGuest) return ENOMEM;
    g->members.push_back(McastMember{lid, qpn});
    if (at < groups_.size()) {
        replace(at, std::move(g));
    } else {
        groups_.push_back(Group{std::move(g), lid});
        ++mine.opened;
    }
    ++mine.attached;
    publish();
    return 0;
}

int MulticastGroups::detach(uint16_t lid, uint32_t qpn, const uint8_t mgid[16]) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < groups_.size(); ++i) {
        const McastGroup& old = *groups_[i].data;
        if (!McastView::same_gid(old.mgid, mgid)) continue;
        auto m = std::find_if(old.members.begin(), old.members.end(),
                              [&](const McastMember& x) { return x.qpn == qpn && x.lid == lid; });
        if (m == old.members.end()) return EINVAL;
        remove_member(i, size_t(m - old.members.begin()));
        publish();
        return 0;
    }
    return EINVAL;
}

void MulticastGroups::detach_all(uint32_t qpn) {
    if (!any_.load(std::memory_order_relaxed)) return;  // destroying QPs costs nothing without groups
    std::lock_guard<std::mutex> lock(mutex_);
    bool changed = false;
    for (size_t i = groups_.size(); i-- > 0;) {
        const McastGroup& old = *groups_[i].data;
        auto m = std::find_if(old.members.begin(), old.members.end(),
                              [&](const McastMember& x) { return x.qpn == qpn; });
        if (m == old.members.end()) continue;
        remove_member(i, size_t(m - old.members.begin()));
        changed = true;
    }
    if (changed) publish();
}

}  // namespace vrdma::shim
