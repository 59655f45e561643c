#include "hca_plugin.h"

#include <atomic>
#include <cstdio>

#include "engine.h"
#include "hca_device.h"
#include "hca_transport.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

constexpr const char* kHca = "--hca";
constexpr const char* kHcaLocal = "--hca-local";

bool check(const TransportArgs& args, std::string& error) {
    if (args.count(kHcaLocal) && !args.count(kHca)) {
        error = "--hca-local needs --hca DEVICE (the device this host's traffic would go through)";
        return false;
    }
    return true;
}

class HcaPlugin final : public TransportPlugin {
public:
    HcaPlugin(std::string spec, bool local) : spec_(std::move(spec)), local_(local) {}

    const char* name() const override { return "hca"; }

    // Before the guests: their device objects are made on these devices,
    // which outlive the workers (the plugin goes after them).
    bool open(const ShimFacts& shim, std::string& error) override {
        for (WorkerPort* w : shim.workers) {
            devices_.push_back(HcaDevice::open(spec_, error));
            if (!devices_.back()) return false;
            HcaDevice& dev = *devices_.back();
            transports_.push_back(std::make_unique<HcaTransport>(dev));
            Engine& eng = w->engine();
            if (!eng.add_object_keeper(transports_.back().get())) {
                error = "hca: another transport keeps objects beside the guests' already";
                return false;
            }
            // --hca-local: the local transport (and the links between
            // workers, which take it from there) hands this host's RC and
            // UC traffic to the device.
            if (local_) eng.local_transport().set_device_gid(dev.gid());
            // After the fabric's group (polled first, whenever it starts).
            if (!w->add_poll_group(dev, false, error)) return false;
        }
        LOG_INFO("hca: %s (opened by each of %zu worker(s))", devices_[0]->describe().c_str(), devices_.size());
        if (std::string advice = HcaDevice::memlock_advice(); !advice.empty()) LOG_WARN("hca: %s", advice.c_str());
        return true;
    }

    std::string ready_words() const override {
        return devices_.empty() ? "" : " hca " + devices_[0]->name() + ":" + std::to_string(devices_[0]->port());
    }

    std::string counters(const AskWorkers& ask) override {
        // Read in each worker's thread; a late answer writes into this
        // copy, not into freed memory.
        struct Totals {
            std::atomic<uint64_t> sends{0}, send_bytes{0}, recvs{0}, completions{0}, errors{0}, ud_lost{0},
                ud_unknown{0};
        };
        auto sum = std::make_shared<Totals>();
        ask([this, sum](WorkerPort& w, std::string&) {
            const HcaDevice::Stats& s = devices_[w.index()]->stats();
            sum->sends += s.sends;
            sum->send_bytes += s.send_bytes;
            sum->recvs += s.recvs;
            sum->completions += s.completions;
            sum->errors += s.errors;
            sum->ud_lost += s.ud_lost;
            sum->ud_unknown += s.ud_unknown;
        });
        char line[512];
        std::snprintf(line, sizeof(line),
                      "hca %s:%u sends %llu send_bytes %llu recvs %llu completions %llu errors %llu copied_bytes 0"
                      " ud_lost %llu ud_unknown %llu\n",
                      devices_[0]->name().c_str(), devices_[0]->port(), (unsigned long long)sum->sends.load(),
                      (unsigned long long)sum->send_bytes.load(), (unsigned long long)sum->recvs.load(),
                      (unsigned long long)sum->completions.load(), (unsigned long long)sum->errors.load(),
                      (unsigned long long)sum->ud_lost.load(), (unsigned long long)sum->ud_unknown.load());
        return line;
    }

private:
    std::string spec_;
    bool local_;
    std::vector<std::unique_ptr<HcaDevice>> devices_;       // by worker
    std::vector<std::unique_ptr<HcaTransport>> transports_;  // by worker
};

std::unique_ptr<TransportPlugin> make(const TransportArgs& args) {
    auto it = args.find(kHca);
    if (it == args.end() || it->second.empty()) return nullptr;
    return std::make_unique<HcaPlugin>(it->second.back(), args.count(kHcaLocal) != 0);
}

}  // namespace

const TransportFactory& hca_factory() {
    static const TransportFactory f{
        "hca",
        {
            {kHca, "DEVICE[:PORT]", false, R"(        Carry guests' traffic to other hosts through this RDMA device (a
        name as ibv_devices prints it; port 1 unless given; the port must
        be active). Between two shims that both have a device, RC and UC
        QPs of guests in the default partition go through the devices,
        which move the data by DMA straight from and to the guests' memory:
        the shim copies none of it (vrdmactl transports). Guest MRs are
        registered on the device and their keys are the device's; guest
        QPs get device QPs and their numbers, guest SRQs device SRQs.
        Everything else (this host's traffic unless --hca-local, UD,
        peers without a device) goes as without --hca. The device's GID
        is sent to peer shims in the fabric handshake.
)"},
            {kHcaLocal, nullptr, false, R"(        With --hca: RC and UC QPs between two guests of this shim go
        through the device too (its loopback), under the same rule as
        across hosts. The device's DMA then moves their data instead of
        the shim's CPU, at the device's speed and latency: for an HCA
        whose loopback DMA is cheap. On Soft-RoCE, which copies in
        software, it is far slower than the default, where the shim
        copies this host's traffic (docs/performance.md). scripts/test-hca.sh
        runs the verbs test suite through the device this way.
)"},
        },
        check,
        make,
    };
    return f;
}

}  // namespace vrdma::shim
