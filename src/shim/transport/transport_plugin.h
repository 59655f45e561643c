// A transport as the daemon sees it (docs/architecture.md "The transport
// contract"): its options, what it opens for each worker, when it starts
// and stops, and what it reports. transport.h is what the engine sees of a
// transport on the data path; this is the rest. Each transport implements
// both in its own folder and is named once, in the daemon's registry
// (daemon/transport_registry.cpp); the daemon and the workers otherwise
// name no transport.
//
// Threads: the factory's calls, open, start, close and the report calls
// run in the daemon's thread; what they give a worker to do goes through
// WorkerPort::post, and the hooks named "in worker w's thread" run there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "metric_samples.h"

namespace vrdma::shim {

class Engine;
class PollGroup;
struct GuestIdentity;

// One command-line option of a transport (a [table] key = value of the
// configuration file: [fabric] listen = ... is --fabric-listen).
struct TransportOption {
    const char* name;   // "--fabric-listen"
    const char* value;  // what --help shows for its value ("ADDR:PORT"); null: a flag
    bool repeatable;    // given once per value; the command line's replace the file's
    const char* help;   // its paragraph of --help: lines indented 8 spaces, each ending in "\n"
};

// The transports' options as given, by name: a flag has one empty value,
// a repeatable option one per time given, any other its last.
using TransportArgs = std::map<std::string, std::vector<std::string>>;

// One worker, as a transport sees it (the daemon's Worker).
class WorkerPort {
public:
    virtual uint32_t index() const = 0;
    virtual Engine& engine() = 0;
    // Runs `task` in the worker's thread, between two passes.
    virtual void post(std::function<void()> task) = 0;
    // Before the worker runs: `group` is polled in every pass and its fds
    // are watched while the worker sleeps; `first`: polled before the
    // groups added so far.
    virtual bool add_poll_group(PollGroup& group, bool first, std::string& error) = 0;

protected:
    ~WorkerPort() = default;
};

// What a transport may know of the shim.
struct ShimFacts {
    std::vector<WorkerPort*> workers;      // valid until close()
    uint16_t lid_first = 0, lid_last = 0;  // the LIDs this shim owns
};

// rdma_cm across hosts: the connection manager's messages to peer shims
// travel on a transport that reaches them. Called in worker 0's thread.
struct CmCarrierHooks {
    // A message the peer shim owning LIDs peer_first..peer_last sent from
    // its guest `src_lid`.
    std::function<void(uint16_t peer_first, uint16_t peer_last, uint16_t src_lid, const uint8_t* msg, size_t len)>
        received;
    // That peer came up or went down.
    std::function<void(uint16_t peer_first, uint16_t peer_last, bool up)> peer;
};

// Runs `f` in each worker's thread in turn (waiting for each); returns
// what each appended to its string, in worker order. A worker that does
// not answer is named in the text.
using AskWorkers = std::function<std::string(const std::function<void(WorkerPort&, std::string&)>& f)>;

class TransportPlugin {
public:
    virtual ~TransportPlugin() = default;
    virtual const char* name() const = 0;

    // Before the run directory is touched (a wrong device fails before
    // anything is published) and before any guest is made.
    virtual bool open(const ShimFacts& shim, std::string& error) {
        (void)shim, (void)error;
        return true;
    }
    // After the guests and the links between the workers are made, before
    // the workers run.
    virtual bool start(const ShimFacts& shim, std::string& error) {
        (void)shim, (void)error;
        return true;
    }
    // After the workers stopped, before their engines go: what refers to
    // an engine goes now. What the guests' objects still hold (a device)
    // may stay until the plugin is destroyed, after the workers.
    virtual void close() {}

    // Its words on the ready line (" fabric lids 1-4").
    virtual std::string ready_words() const { return ""; }
    // In worker w's thread: a guest of that worker was added.
    virtual void guest_added(WorkerPort& w, const GuestIdentity& guest) { (void)w, (void)guest; }

    // vrdmactl transports: its lines.
    virtual std::string counters(const AskWorkers& ask) {
        (void)ask;
        return "";
    }
    // vrdmactl peers: its peer shims ("": it reaches none).
    virtual std::string peers(const AskWorkers& ask) {
        (void)ask;
        return "";
    }
    // --metrics-listen: its samples, in worker w's thread, and their families.
    virtual void metric_samples(WorkerPort& w, std::string& out) { (void)w, (void)out; }
    virtual std::vector<MetricFamily> metric_families() const { return {}; }

    // The shim's LIDs are a range its peer shims route to it: a guest added
    // at run time takes one of them.
    virtual bool reaches_peer_shims() const { return false; }
    // rdma_cm across hosts: the largest message it carries (0: it carries
    // none); the hooks are set before start.
    virtual size_t cm_capacity() const { return 0; }
    virtual void set_cm_hooks(CmCarrierHooks hooks) { (void)hooks; }
    // In worker 0's thread: a CM message to the peer shim owning LIDs from
    // `peer_first`, from this shim's guest `src_lid`. False if it cannot go
    // (the peer is down or its link busy).
    virtual bool send_cm(uint16_t peer_first, uint16_t src_lid, const uint8_t* msg, size_t len) {
        (void)peer_first, (void)src_lid, (void)msg, (void)len;
        return false;
    }
};

// How the daemon learns of a transport: its options, and the plugin they
// ask for.
struct TransportFactory {
    const char* name;
    std::vector<TransportOption> options;
    // At parse time: false with a usage error when the values do not go
    // together (args holds every transport's options; it reads its own).
    bool (*check)(const TransportArgs& args, std::string& error);
    // The transport the options ask for, or null when they ask for none.
    std::unique_ptr<TransportPlugin> (*make)(const TransportArgs& args);
};

}  // namespace vrdma::shim
