// Publishes a guest's device for libibverbs: the sysfs-shaped tree under
// RUN_DIR/NAME/sys and the /dev/infiniband/uverbs_vrdma_NAME_HASH link (see
// docs/protocol.md, Discovery). Values come from device_model.
//
// RUN_DIR/NAME and everything in it but the socket belong to the shim's
// user, mode 0755 (world-readable, as the kernel's sysfs is): the guest's
// owner is given only its socket, so it can neither rename nor replace a
// component of the tree. Every file is written relative to directory fds
// opened without following links (docs/reliability.md "The host's files").
#pragma once

#include <string>

#include "device_model.h"
#include "vrdma_common/unique_fd.h"

namespace vrdma::shim {

std::string uverbs_name(const std::string& run_dir, const std::string& guest);  // "uverbs_vrdma_NAME_HASH"

class GuestPublication {
public:
    // Replaces stale leftovers (RUN_DIR/NAME, a /dev link to /dev/null).
    // `run_fd` is the run directory's fd, `run_dir` its path.
    // `in_vm`: the tree a VM's agent publishes inside the VM (abi::kVmAttr).
    bool publish(int run_fd, const std::string& run_dir, const std::string& dev_dir, const GuestIdentity& id,
                 std::string& error, bool in_vm = false);
    // Removes everything publish() created (including the guest's socket,
    // which lives in RUN_DIR/NAME).
    void unpublish();
    ~GuestPublication() { unpublish(); }
    // Rewrites ports/1/state and phys_state (ACTIVE/LinkUp or DOWN/Disabled).
    bool set_port_state(bool active, std::string& error);
    // RUN_DIR/NAME, where the guest's socket goes (valid after publish).
    int guest_dir_fd() const { return guest_fd_.get(); }

private:
    UniqueFd run_fd_;    // a dup of the run directory's fd
    std::string name_;   // NAME in it
    std::string port_dir_;
    UniqueFd guest_fd_;  // RUN_DIR/NAME
    UniqueFd port_fd_;   // .../ports/1
    UniqueFd dev_fd_;    // /dev/infiniband
    std::string dev_link_;
};

}  // namespace vrdma::shim
