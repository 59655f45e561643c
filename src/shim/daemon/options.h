// Command line of vrdma-shim.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ip_address.h"
#include "device_model.h"
#include "guess_throttle.h"
#include "guest_access.h"
#include "transport_plugin.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {

constexpr uint32_t kMaxWorkers = 64;

struct Options {
    std::string run_dir = "/run/vrdma";
    std::vector<std::string> guests;
    std::vector<GuestAccess> access;  // parallel to guests: who may use each
    std::vector<bool> controlled_qkeys;  // parallel to guests: :controlled-qkeys given
    std::vector<std::vector<uint16_t>> pkeys;  // parallel to guests: :pkeys=..., empty: the default 0xffff
    std::vector<int> worker_of;  // parallel to guests: :worker=K, -1: round-robin
    std::vector<uint32_t> weights;  // parallel to guests: :weight=W (GuestRegistry::set_weight), 1 by default
    std::vector<std::vector<cm::IpAddress>> addresses;  // parallel to guests: :ip=ADDR,... (rdma_cm)
    std::vector<uint64_t> vm_memory;  // parallel to guests: :vm, :vm-memory=SIZE (0: not a VM guest)
    // --workers: worker threads (0: the default, default_workers()).
    uint32_t workers = 0;
    // --worker-cpus: the CPU each worker is pinned to, by worker (empty:
    // not pinned).
    std::vector<uint32_t> worker_cpus;
    // --idle-yield always: an idle pass yields its CPU even where every
    // runnable thread has one (core_census.h; default auto).
    bool idle_yield_always = false;
    uint32_t lid_base = 1;
    LogLevel log_level = LogLevel::Info;
    Quotas quotas;  // per guest, --quota KEY=VALUE
    // The transports' options (transport_registry.h: --fabric-*, --hca),
    // by name, as each transport's factory reads them.
    TransportArgs transport_args;
    uint32_t attach_timeout_s = 10;  // an unattached connection is closed after this
    uint32_t rkey_guess_limit = GuessThrottle::kDefaultLimit;  // remote access errors a second per source
    uint32_t qkey_guess_limit = GuessThrottle::kDefaultLimit;  // wrong-qkey datagrams a second per source and guest
    uint32_t lid_count = 0;  // LIDs this shim owns from lid_base (0: one per guest)
    std::string metrics_listen;  // --metrics-listen ADDR:PORT: Prometheus exposition (empty: none)
    bool help = false;
    // --config FILE (empty: none) and the command line without it: what a
    // reload reads again (Daemon::reload).
    std::string config_file;
    std::vector<std::string> cli_args;
    std::vector<std::string> args;  // the effective command line, file merged in
};

// Parses argv, and the --config file it names. On a usage error returns
// false with one line in `error`.
bool parse_options(int argc, char** argv, Options& out, std::string& error);
// Parses an effective command line (no program name, no --config).
bool parse_args(const std::vector<std::string>& args, Options& out, std::string& error);
// The command line that `config` (may be empty) and `cli` say together
// (config_file.h: the command line overrides the file). False with `error`
// when the file cannot be read or says something the command line would
// refuse.
bool effective_args(const std::string& config, const std::vector<std::string>& cli, std::vector<std::string>& args,
                    std::string& error);
// A guest's weight, as --guest NAME:weight=W and vrdmactl weight give it:
// 1 to kMaxGuestWeight.
bool parse_weight(const std::string& text, uint32_t& weight);

// The --help text.
std::string help_text();

// The worker count when --workers is not given: half the CPUs this
// process may run on (sched_getaffinity), at least 1 (docs/protocol.md
// "Workers").
uint32_t default_workers();
// What a worker needs to serve guest `i`, copied out of the options (which
// the daemon's thread extends when guests are added at run time).
struct GuestSettings {
    std::string name;
    GuestAccess access;
    bool controlled_qkeys = false;
    std::vector<uint16_t> pkeys;  // empty: the default partition
    uint32_t weight = 1;
    uint64_t vm_memory = 0;  // a VM guest: its device's memory (vm_port.h); 0: none
};
GuestSettings guest_settings(const Options& o, size_t i);

// Parses one --guest argument, NAME[:owner=...][:group=...][:pkeys=...]
// [:controlled-qkeys][:worker=K][:weight=W], and appends the guest to `o`'s
// parallel lists; false with `error` set (the name must not be in
// `o.guests` already).
bool parse_guest_arg(const std::string& arg, Options& o, std::string& error);

// The worker that serves guest `i` (after parse_options: workers is set).
uint32_t worker_of_guest(const Options& o, size_t i);

}  // namespace vrdma::shim
