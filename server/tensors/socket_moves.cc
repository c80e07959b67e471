// Block moves on the transfer socket (server/api/transfer_socket.h, SessionMove): MoveBlocks with
// `wait` without gRPC, for a decode step's few blocks. The request names its session (a
// socket has no metadata); the kernel names the caller, who must own it.

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/agent/agent_core.h"
#include "server/local/session_call.h"
#include "server/tensors/tensor_service.h"

namespace ferry::server {

MoveCalls TensorService::MovesFor(const LocalCaller& caller) {
  MoveCalls calls;
  calls.start = [this, caller](const ferry::v1::SessionMove& move,
                               std::function<void(ferry::v1::TransferResult)> answer)
      -> absl::StatusOr<uint64_t> {
    ASSIGN_OR_RETURN(uint64_t session,
                     SessionOfCaller(move.session(), "move.session", caller, core_->sessions(),
                                     core_->local_callers()));
    if (session == 0) {
      return absl::FailedPreconditionError(
          "move.session: block lists belong to a session (OpenSession); name yours");
    }
    const ferry::v1::MoveBlocksRequest& req = move.request();
    // The peer is asked by the transfer's own deadline (bounded again by the mover).
    const absl::Time deadline = req.timeout_ms() == 0
                                    ? absl::InfiniteFuture()
                                    : absl::Now() + absl::Milliseconds(req.timeout_ms());
    // The transfer's end answers (the move's hook copies the result for it).
    RETURN_IF_ERROR(MayReachOwnNodeList(caller, req));
    ASSIGN_OR_RETURN(ferry::v1::MoveBlocksResponse started,
                     core_->tensors().mover().Move(req, session, caller.uid, req.timeout_ms(),
                                                   deadline, std::move(answer)));
    return started.transfer_id();
  };
  calls.may_block = [this](const ferry::v1::SessionMove& move) -> std::optional<std::string> {
    if (!core_->tensors().mover().MayAskPeer(move.request())) return std::nullopt;
    return move.request().peer();
  };
  return calls;
}

}  // namespace ferry::server
