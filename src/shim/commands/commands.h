// Command handlers: one per CmdOp. Each gets a private copy of the request
// record (never the shared slot), validates every field, and fills the
// response. Returns 0 or a positive errno for the slot's status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "context.h"
#include "engine.h"
#include "segment_table.h"
#include "vrdma/abi.h"

namespace vrdma::shim {

using CmdHandler = int (*)(Engine& eng, Context& ctx, const uint8_t* req, uint8_t* resp);

// One entry of the command table (command_dispatch.cpp): the op, its name
// in logs, its handler and the sizes of its request and response records
// (0: none). The table names every CmdOp in [1, kMax) exactly once; that
// and the record sizes are checked at compile time.
struct CommandSpec {
    abi::CmdOp op;
    const char* name;
    CmdHandler handler;
    size_t req_size;
    size_t resp_size;
};

// The whole table, and the entry of one op (nullptr for an unknown op).
std::span<const CommandSpec> command_table();
const CommandSpec* find_command(uint32_t op);
// The op's name ("QueryDevice", ...), "unknown" for an unknown op.
const char* command_name(uint32_t op);

// Runs the handler of `op`; EOPNOTSUPP for an unknown op.
int dispatch_command(Engine& eng, Context& ctx, uint32_t op, const uint8_t* req, uint8_t* resp);

int cmd_query_device(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_query_port(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_alloc_pd(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_dealloc_pd(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_reg_mr(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_dereg_mr(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_create_cq(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_destroy_cq(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_create_qp(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_modify_qp(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_query_qp(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_destroy_qp(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_create_srq(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_modify_srq(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_query_srq(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_destroy_srq(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_tm_op(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_create_ah(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_destroy_ah(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_resize_cq(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_rereg_mr(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_alloc_mw(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_dealloc_mw(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_open_xrcd(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_close_xrcd(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_attach_mcast(Engine&, Context&, const uint8_t*, uint8_t*);
int cmd_detach_mcast(Engine&, Context&, const uint8_t*, uint8_t*);

// Helpers shared by the handlers.
template <typename T>
T load_req(const uint8_t* req) {
    static_assert(sizeof(T) <= abi::kCmdReqBytes);
    T t;
    std::memcpy(&t, req, sizeof(T));
    return t;
}
template <typename T>
void store_resp(uint8_t* resp, const T& t) {
    static_assert(sizeof(T) <= abi::kCmdRespBytes);
    std::memcpy(resp, &t, sizeof(T));
}

// Quota charges (quota.h) for an object being created: given back on any
// early return unless keep() is called, after which the object holds them
// until its destroy command gives them back.
class PendingCharges {
public:
    explicit PendingCharges(Context& ctx) : ctx_(ctx) {}
    PendingCharges(const PendingCharges&) = delete;
    PendingCharges& operator=(const PendingCharges&) = delete;
    ~PendingCharges() {
        if (kept_) return;
        for (unsigned i = 0; i < kResCount; ++i)
            if (n_[i]) ctx_.charges.give(Res(i), n_[i]);
    }
    bool take(Res r, uint64_t n, const char* what) {
        if (!ctx_.charges.take(r, n, what)) return false;
        n_[unsigned(r)] += n;
        return true;
    }
    void keep() { kept_ = true; }

private:
    Context& ctx_;
    uint64_t n_[kResCount] = {};
    bool kept_ = false;
};

// A ring of `bytes` at `gva`: 64-byte aligned, inside one segment of the
// context. 0, EINVAL (alignment, size) or EFAULT (not inside one segment).
int map_ring(const Context& ctx, uint64_t gva, uint64_t bytes, HostRange& out);

// Entries and stride of a work queue: both powers of two, entries <= limit,
// stride in [kMinWqeStride, kMaxWqeStride] and >= `min_stride`.
bool wq_geometry_ok(uint32_t entries, uint32_t limit, uint32_t stride, uint64_t min_stride);

}  // namespace vrdma::shim
