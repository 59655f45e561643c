// The local transport: executes a send WQE of a QP against a QP of any guest
// of this shim, moving data with memcpy between the two guests' MR mappings
// (no bounce buffers), with the RC and UD semantics of docs/protocol.md.
#pragma once

#include "context.h"
#include "engine.h"
#include "resources.h"
#include "work_queue.h"

namespace vrdma::shim {

enum class ExecResult {
    Done,  // the WQE is finished (its completion written if any): consume it
    Wait,  // RNR or retry timer armed on the QP: try the same WQE later
};

// Executes a send WQE already copied out (`status` is what read_send_wqe
// reported). Writes the requester's completion when needed and moves QPs to
// error as the protocol requires.
ExecResult execute_send(Engine& eng, Context& ctx, Qp& qp, SendWork& w, uint32_t status);

// Completion for a send WQE of `qp` (requester side).
void complete_send(Qp& qp, const abi::SendWqe& hdr, uint32_t status, uint32_t byte_len);

// Maps an ibv_wr_opcode to the ibv_wc_opcode of its completion.
uint32_t wc_opcode_for(uint32_t wr_opcode);

}  // namespace vrdma::shim
