// The text of `vrdmactl load`: who uses the shim. One line per worker,
// then one per guest (with the worker that serves it):
//   worker 0 guests 3 contexts 2 passes 81234 busy_s 1.204 asleep_s 9.871 uptime_s 12.005
//   guest a contexts 1 turns 10311 messages 20480 bytes 83886080 busy_s 0.903 qp_visits 12 worker 0
// busy_s: time in turns that found work (a guest's: its contexts' turns,
// commands included); asleep_s: time the worker slept with nothing to do;
// the rest of uptime_s is polling, the fabric and attaches. messages and
// bytes: what the guest's QPs sent, over every transport, resends not
// counted again (guest_load.h).
#pragma once

#include <cstdint>
#include <string>

#include "engine.h"

namespace vrdma::shim {

// Appends worker `worker`'s line (its engine `eng`) to `workers` and its
// guests' lines to `guests`.
void load_report(Engine& eng, uint32_t worker, uint64_t asleep_ns, uint64_t uptime_ns, std::string& workers,
                 std::string& guests);

}  // namespace vrdma::shim
