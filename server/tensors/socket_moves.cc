// Block moves on the transfer socket (server/api/transfer_socket.h, SessionMove): MoveBlocks with
// `wait` without gRPC, for a decode step's few blocks. The request names its session (a
// socket has no metadata); the kernel names the caller, who must own it.

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/agent/agent_core.h"
#include "server/local/session_call.h"
#include "server/tensors/tensor_service.h"

namespace ferry::server {

class TensorService::CallerMoves final : public MoveCalls {
 public:
  CallerMoves(TensorService* service, LocalCaller caller)
      : core_(service->core_), service_(service), caller_(std::move(caller)) {}

  absl::StatusOr<uint64_t> Start(const ferry::v1::SessionMove& move,
                                 AnswerFn answer) const override {
    ASSIGN_OR_RETURN(uint64_t session,
                     SessionOfCaller(move.session(), "move.session", caller_, core_->sessions(),
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
    RETURN_IF_ERROR(service_->MayReachOwnNodeList(caller_, req));
    ASSIGN_OR_RETURN(ferry::v1::MoveBlocksResponse started,
                     core_->tensors().mover().Move(req, session, caller_.uid, req.timeout_ms(),
                                                   deadline, std::move(answer)));
    return started.transfer_id();
  }

  std::optional<std::string> MayBlockOn(const ferry::v1::SessionMove& move) const override {
    if (!core_->tensors().mover().MayAskPeer(move.request())) return std::nullopt;
    return move.request().peer();
  }

 private:
  AgentCore* const core_;
  TensorService* const service_;
  const LocalCaller caller_;
};

std::shared_ptr<const MoveCalls> TensorService::MovesFor(const LocalCaller& caller) {
  return std::make_shared<CallerMoves>(this, caller);
}

}  // namespace ferry::server
