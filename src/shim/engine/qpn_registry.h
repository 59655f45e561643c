// The QPN registry of one worker: its QPs by number, and the (LID, QPN)
// lookup every responder, binding and transport's receive side makes. The
// numbers are unique per shim (SharedTables: drawn at random, quarantined
// once freed); this table only says which context of this worker holds a
// number it took.
#pragma once

#include <cstdint>

#include "flat_map.h"

namespace vrdma::shim {

class Context;
struct Qp;
class SharedTables;

// A QP found by number: its context, the QP and its handle in the context.
struct QpRef {
    Context* ctx = nullptr;
    Qp* qp = nullptr;
    uint32_t handle = 0;
    explicit operator bool() const { return qp != nullptr; }
};

class QpnRegistry {
public:
    explicit QpnRegistry(SharedTables& shared) : shared_(shared) {}
    QpnRegistry(const QpnRegistry&) = delete;
    QpnRegistry& operator=(const QpnRegistry&) = delete;

    // A fresh QPN, taken shim-wide (0: none left).
    uint32_t alloc();
    bool taken(uint32_t qpn) const;
    // Registers QP `handle` of `ctx` as `qpn` (taken shim-wide if it was not).
    void add(uint32_t qpn, Context& ctx, uint32_t handle);
    // The QP goes: its number leaves the multicast groups and goes into
    // quarantine.
    void remove(uint32_t qpn);
    // The QP (lid, qpn), if a live context of this worker holds it.
    QpRef find(uint16_t lid, uint32_t qpn) const;
    // The QP with `qpn`, whatever its LID (device completions name the
    // device QP, whose QPN is the guest's: hca_bind.h).
    QpRef find_by_qpn(uint32_t qpn) const;

private:
    struct Loc {
        Context* ctx = nullptr;
        uint32_t handle = 0;
    };
    SharedTables& shared_;
    FlatU32Map<Loc> qpns_;
};

}  // namespace vrdma::shim
