// Tag matching in software (IBV_SRQT_TM; docs/protocol.md "Tag matching").
//
// A TM SRQ holds two kinds of receive buffers: the ordinary ones the
// application posts with ibv_post_srq_recv (for what software handles:
// unexpected and untagged messages) and tagged buffers it adds with
// ibv_post_srq_ops (TagList). Each message sent to an RC QP on a TM SRQ
// begins with a tag-matching header (TMH). The responder cannot see that
// header before the payload moves (a transport may stream it from a
// socket), so the whole message lands in the QP's staging buffer
// (tm_begin), and once it is there tm_finish reads the TMH and decides:
//   EAGER, tag matched  the payload after the TMH goes to the tagged buffer:
//                       IBV_WC_TM_RECV with MATCH and DATA_VALID, the tag
//                       and app_ctx in the completion;
//   RNDV, tag matched   the shim reads the sender's buffer named by the
//                       rendezvous header into the tagged buffer and sends
//                       the sender a FIN message; two completions (MATCH,
//                       then DATA_VALID). A sender on this worker is read
//                       directly; one on another worker or shim through
//                       the QP's transport, with the shim's own requests
//                       (request.h: kTmRndvRead, kTmRndvFin), as a device
//                       reads with RDMA READs. Data larger than the tagged
//                       buffer completes it with IBV_WC_TM_RNDV_INCOMPLETE
//                       and the headers in it, for software to finish, as
//                       the verbs allow;
//   no match            the whole message goes to an ordinary buffer as
//                       unexpected (IBV_WC_TM_RECV, no flags), counted;
//   NO_TAG              the whole message goes to an ordinary buffer
//                       (IBV_WC_TM_NO_TAG).
// Nothing is consumed before tm_finish: a message that finds no buffer of
// the kind it needs is answered with an RNR NAK then, and its PSN is
// expected again.
#pragma once

#include <cstdint>

#include "request.h"
#include "responder.h"
#include "resources.h"

namespace vrdma::shim {

class Context;
class Engine;

// The largest message a TM SRQ takes (its staging buffer, one per QP that
// receives from one, charged to the guest): larger sends are refused with a
// remote invalid request. Eager messages are small; rendezvous moves large
// data.
constexpr uint64_t kTmMaxMessageBytes = 64u << 10;
// Tagged buffers per TM SRQ (DeviceAttr::max_tm_tags) and outstanding list
// operations (each is a command that completes before the next).
constexpr uint32_t kTmMaxTags = 1024;
constexpr uint32_t kTmMaxOps = 64;

enum class TmBegin { Staged, Rnr, TooLong, NoMemory, Error };

// Stages an RC SEND (with or without immediate) to `qp`, which is on TM
// SRQ `srq`: d.spans name the staging buffer (pinned in `pins` when given).
// Rnr: neither an ordinary buffer nor a tag that could match is there.
// NoMemory: the QP's staging buffer would pass the guest's quotas.
TmBegin tm_begin(Engine& eng, const Request& req, Context& ctx, Qp& qp, Srq& srq, Delivery& d, Pins* pins);

// responder_finish for a staged message (d.tm): matches and delivers it,
// writes its completions, or turns d.resp into an RNR NAK.
void tm_finish(Delivery& d, bool payload_ok);

// The rendezvous reads matched at `qp` (QpResponder::tm_rendezvous), in its pass:
// the data from the sender's memory into the tagged buffer, the FIN to the
// sender, and the DATA_VALID completion.
void tm_run_rendezvous(Engine& eng, Context& ctx, Qp& qp);
// The QP failed: each matched rendezvous completes flushed.
void tm_flush_rendezvous(Context& ctx, Qp& qp);

// The answer (resp.tm) to one of `qp`'s rendezvous requests; `local_error`:
// its data could not be written here (an asynchronous transport's
// status). Answers out of order, or for a rendezvous that ended, are
// ignored.
void tm_answered(Engine& eng, Context& ctx, Qp& qp, const Response& resp, uint32_t local_error);
// Where the data of `qp`'s rendezvous read `psn` goes, for a transport
// that reads it in later (the fabric): IBV_WC_SUCCESS, a local error, or
// IBV_WC_LOC_QP_OP_ERR when no such read waits.
uint32_t tm_read_target(Context& ctx, Qp& qp, uint32_t psn, Span* out, uint32_t& spans, uint64_t& len, Pins* pins);

// A rendezvous FIN (kTmRndvFin) to QP `sq` from QP `qpn` at `lid`:
// `headers` (32 bytes) are the rendezvous' TMH and RVH.
void tm_deliver_fin(Context& sctx, Qp& sq, const uint8_t* headers, uint32_t qpn, uint16_t lid);

// One tag list operation (the TmOp command): 0 or a positive errno. ADD
// returns the entry's handle in `handle`.
int tm_list_op(Context& ctx, Srq& srq, const abi::CmdTmOpReq& op, uint32_t& handle);

}  // namespace vrdma::shim
