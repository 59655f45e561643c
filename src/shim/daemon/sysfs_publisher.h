// Publishes a guest's device for libibverbs: the sysfs-shaped tree under
// RUN_DIR/NAME/sys and the /dev/infiniband/uverbs_vrdma_NAME_HASH link (see
// docs/protocol.md, Discovery). Values come from device_model.
#pragma once

#include <string>

#include "device_model.h"

namespace vrdma::shim {

std::string uverbs_name(const std::string& run_dir, const std::string& guest);  // "uverbs_vrdma_NAME_HASH"

class GuestPublication {
public:
    // Replaces stale leftovers (RUN_DIR/NAME, a /dev link to /dev/null).
    bool publish(const std::string& run_dir, const std::string& dev_dir, const GuestIdentity& id,
                 std::string& error);
    // Removes everything publish() created (including the guest's socket,
    // which lives in RUN_DIR/NAME).
    void unpublish();
    ~GuestPublication() { unpublish(); }
    // Rewrites ports/1/state and phys_state (ACTIVE/LinkUp or DOWN/Disabled).
    bool set_port_state(bool active, std::string& error);

private:
    std::string port_dir_;
    std::string guest_dir_;
    std::string dev_link_;
};

}  // namespace vrdma::shim
