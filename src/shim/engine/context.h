// One attached process ("context"): its arena and control block, the fds it
// passed, its segment table and its resource tables. Built over an arena
// memfd, so tests can create one in-process without a socket.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "device_model.h"
#include "handle_table.h"
#include "key_table.h"
#include "resources.h"
#include "segment_table.h"
#include "vrdma/abi.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

class Context {
public:
    Context(uint64_t id, const GuestIdentity& guest, const Quotas& quotas, std::shared_ptr<Mapping> arena,
            UniqueFd kick, UniqueFd cmd_done, UniqueFd async, GuestUsage* usage = nullptr);
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    uint64_t id() const { return id_; }
    const GuestIdentity& guest() const { return *guest_; }
    const Quotas& quotas() const { return *quotas_; }
    abi::ControlBlock* control() const { return cb_; }
    int kick_fd() const { return kick_.get(); }

    void signal_cmd_done();
    // Writes one 16-byte async event record, never blocking. False when the
    // record could not be written (no async pipe, pipe full, reader gone).
    bool post_async_event(uint32_t event_type, uint64_t element);
    // A VM's context: async events go to the control block's VmAsyncRing.
    void use_vm_async_ring() { vm_async_ = true; }

    // Completion channels (protocol.md "Events"): the write ends of the
    // guest's channel pipes, by the channel id the guest chose.
    static constexpr size_t kMaxChannels = 1024;
    // 0, EEXIST (id in use), EINVAL (id 0 or not a pipe) or ENOMEM (limit).
    int add_channel(uint32_t id, UniqueFd write_end);
    bool remove_channel(uint32_t id);
    bool has_channel(uint32_t id) const { return channels_.count(id) != 0; }
    // Writes one 8-byte completion event record, never blocking.
    bool post_comp_event(uint32_t channel_id, uint64_t cq_user_handle);
    // What this context's resources charge to its guest's quotas (given
    // back when the context is destroyed; mappings carry their own).
    Charges charges;
    SegmentTable segments;
    HandleTable<Pd, HandleType::Pd> pds;
    HandleTable<Mr, HandleType::Mr> mrs;
    HandleTable<Cq, HandleType::Cq> cqs;
    HandleTable<Qp, HandleType::Qp> qps;
    HandleTable<Srq, HandleType::Srq> srqs;
    HandleTable<Ah, HandleType::Ah> ahs;
    HandleTable<Mw, HandleType::Mw> mws;
    HandleTable<Xrcd, HandleType::Xrcd> xrcds;
    std::map<uint32_t, uint32_t> xrc_srqs;  // XRC SRQs: number -> handle
    KeyTable keys;  // lkeys and rkeys -> MR and MW handles

    // Engine state.
    uint32_t cmd_cons = 0;
    uint32_t last_doorbell = 0;
    bool rescan = true;              // look at every queue on the next pass
    void request_rescan() {
        rescan = true;
        request_pass();
    }
    // QPs to look at on the next pass (found in the guest's work bits, or
    // marked by the shim: a response arrived, room freed). No allocation
    // once the lists have grown to the number of QPs.
    void mark_work(Qp& qp) {
        if (qp.work_marked) return;
        qp.work_marked = true;
        work_marked_.push_back(qp.handle);
        request_pass();
    }
    bool has_marked() const { return !work_marked_.empty() || !work_skipped_.empty(); }

    // Dormancy (engine.h, protocol.md "Idle contexts"): a context idle for a
    // while is left out of the passes, its guest told the shim sleeps; the
    // kick eventfd or the shim itself (request_pass) wakes it.
    bool dormant = false;
    bool wake_queued = false;        // its id is on the engine's wake list
    uint64_t last_work_ns = 0;       // the last pass that made progress
    void set_wake_list(std::vector<uint64_t>* list) { wake_list_ = list; }
    // The shim has work for this context (a response arrived, a QP failed):
    // a dormant one joins the next pass.
    void request_pass() {
        if (!dormant || wake_queued || !wake_list_) return;
        wake_queued = true;
        wake_list_->push_back(id_);
    }
    // A QP with work that the turn had no room for (engine.h, work per
    // turn): on the next pass it comes before the QPs marked otherwise, so
    // that one busy QP cannot keep the others of its context waiting.
    void mark_skipped(Qp& qp) {
        if (qp.work_marked) return;
        qp.work_marked = true;
        work_skipped_.push_back(qp.handle);
        request_pass();
    }
    // The marked QPs, handed over for one pass, skipped ones first (the
    // lists start anew).
    std::vector<uint32_t>& take_marked() {
        work_batch_.clear();
        work_batch_.swap(work_skipped_);
        work_batch_.insert(work_batch_.end(), work_marked_.begin(), work_marked_.end());
        work_marked_.clear();
        return work_batch_;
    }
    // CQs holding a silent completion (cq_events.h), looked at when the
    // guest rings the doorbell, as it does after arming a CQ.
    std::vector<uint32_t> silent_cqs;
    uint64_t next_deadline_ns = 0;   // earliest waiting QP deadline, 0: none
    // A QP waits for `when` (0: nothing): the earliest such deadline is kept.
    void note_deadline(uint64_t when) {
        if (when && (!next_deadline_ns || when < next_deadline_ns)) next_deadline_ns = when;
    }
    bool dead = false;               // protocol violation: detach it (set by mark_dead)
    void mark_dead() {
        if (dead) return;
        dead = true;
        if (dead_count_) ++*dead_count_;
    }
    // Where mark_dead counts (the engine's: finding the dead costs nothing
    // per pass while there are none).
    void count_deaths_in(uint32_t* count) { dead_count_ = count; }
    // After a guest_fd_* call: marks the context dead when the call was
    // interrupted by the guard timer (the guest made the fd blocking).
    void check_blocked(ssize_t n, const char* fd_name);

private:
    uint32_t* dead_count_ = nullptr;
    uint64_t id_;
    const GuestIdentity* guest_;
    const Quotas* quotas_;
    std::shared_ptr<Mapping> arena_;
    abi::ControlBlock* cb_;
    UniqueFd kick_, cmd_done_, async_;
    bool post_vm_async(const abi::AsyncRecord& rec);
    bool vm_async_ = false;
    uint32_t vm_async_prod_ = 0;  // the ring's producer index (never read back)
    std::map<uint32_t, UniqueFd> channels_;
    bool warned_lost_event_ = false;  // one warning per context, not one per event
    std::vector<uint32_t> work_marked_, work_skipped_, work_batch_;
    std::vector<uint64_t>* wake_list_ = nullptr;  // the engine's, by context id
};

}  // namespace vrdma::shim
