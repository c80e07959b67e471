// The Tensors and TensorPeer calls over prepared block lists: PrepareBlocks, ReleaseBlocks,
// MoveBlocks (server/tensors/block_mover.h; a callback call: with `wait` it answers once the
// move ended, no thread waiting, as Agent.Transfer does), Notify (a notification alone) and
// the peer's ResolveBlocks and ChecksumBlocks.

#include "absl/strings/str_cat.h"
#include "base/echo.h"
#include "base/grpc_status.h"
#include "base/status_macros.h"
#include "server/agent/agent_core.h"
#include "server/local/session_call.h"
#include "server/peers/caller_identity.h"
#include "server/tensors/restart_note.h"
#include "server/tensors/tensor_service.h"
#include "server/api/waiting_call.h"

namespace ferry::server {
namespace {

// The session a block call runs in: lists belong to one, and end with it.
absl::StatusOr<uint64_t> ListSession(const grpc::ServerContextBase& ctx, AgentCore& core) {
  ASSIGN_OR_RETURN(uint64_t session, SessionOfCall(ctx, core.sessions(), core.local_callers()));
  if (session == 0) {
    return absl::FailedPreconditionError(
        "ferry-session: block lists belong to a session (OpenSession), which ends them when "
        "the client goes");
  }
  return session;
}

}  // namespace

grpc::Status TensorService::PrepareBlocks(grpc::ServerContext* ctx,
                                          const ferry::v1::PrepareBlocksRequest* req,
                                          ferry::v1::PrepareBlocksResponse* resp) {
  auto session = ListSession(*ctx, *core_);
  if (!session.ok()) return ToGrpcStatus(session.status());
  // A list is a way to move its buffers' bytes: only over buffers the caller may use.
  for (int r = 0; r < req->extents_size(); ++r) {
    absl::Status mine = MayUseBuffer(core_->local_callers(), *ctx, core_->buffers(),
                                     req->extents(r).buffer(), absl::StrCat("extents[", r, "]"));
    if (!mine.ok()) return ToGrpcStatus(mine);
  }
  auto list = core_->tensors().blocks().Prepare({req->extents().begin(), req->extents().end()},
                                                req->name(), *session);
  if (!list.ok()) return ToGrpcStatus(list.status());
  if (!core_->sessions().IsOpen(*session)) {
    // The session ended while we prepared: its sweep may have missed this list.
    core_->tensors().blocks().Release((*list)->id(), *session).IgnoreError();
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "ferry-session: the session ended");
  }
  resp->set_list((*list)->id());
  resp->set_blocks((*list)->size());
  return grpc::Status::OK;
}

grpc::Status TensorService::ReleaseBlocks(grpc::ServerContext* ctx,
                                          const ferry::v1::ReleaseBlocksRequest* req,
                                          ferry::v1::ReleaseBlocksResponse*) {
  auto session = ListSession(*ctx, *core_);
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(core_->tensors().blocks().Release(req->list(), *session));
}

grpc::ServerUnaryReactor* TensorService::MoveBlocks(grpc::CallbackServerContext* ctx,
                                                    const ferry::v1::MoveBlocksRequest* req,
                                                    ferry::v1::MoveBlocksResponse* resp) {
  auto session = ListSession(*ctx, *core_);
  if (!session.ok()) {
    grpc::ServerUnaryReactor* refused = ctx->DefaultReactor();
    refused->Finish(ToGrpcStatus(session.status()));
    return refused;
  }
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  std::optional<LocalCaller> caller = core_->local_callers().Of(*ctx);
  WaitingCall call;
  // Only the peer's answer is waited for in `start`; the transfer runs on after it returned.
  call.start = [this, req, resp, session = *session, caller,
                deadline](std::function<void(ferry::v1::TransferResult)> ended)
      -> absl::StatusOr<uint64_t> {
    RETURN_IF_ERROR(MayReachOwnNodeList(caller, *req));
    BlockMover::Finished then;
    if (req->wait()) then = ended;
    ASSIGN_OR_RETURN(*resp, core_->tensors().mover().Move(
                                *req, session, LocalCallers::OwnerUid(caller), req->timeout_ms(),
                                deadline, std::move(then)));
    if (!req->wait()) ended(ferry::v1::TransferResult());  // answered once started
    return resp->transfer_id();
  };
  call.may_block = [this, req]() -> std::optional<std::string> {
    if (!core_->tensors().mover().MayAskPeer(*req)) return std::nullopt;
    return req->peer();
  };
  call.respond = [req, resp](ferry::v1::TransferResult result) {
    if (req->wait()) *resp->mutable_result() = std::move(result);
  };
  // With `wait`, answered just before the call's deadline even if the transfer has not
  // ended (RUNNING): a failed call would lose the id the caller follows it by.
  if (req->wait() && deadline != absl::InfiniteFuture()) {
    call.answer_by = deadline - absl::Milliseconds(500);
    call.as_it_stands = [this](uint64_t id) {
      auto transfer = core_->engine().Find(id);
      return transfer.ok() ? (*transfer)->Result(ResultPage{}) : ferry::v1::TransferResult();
    };
  }
  return StartWaitingCall(ctx, &starters_, std::move(call));
}

grpc::Status TensorService::Notify(grpc::ServerContext* ctx, const ferry::v1::NotifyRequest* req,
                                   ferry::v1::NotifyResult*) {
  auto session = ListSession(*ctx, *core_);
  if (!session.ok()) return ToGrpcStatus(session.status());
  // A list of this node itself: only one the caller may use, as for a move to it.
  ferry::v1::MoveBlocksRequest as_move;
  as_move.set_peer(req->peer());
  as_move.set_remote_list(req->remote_list());
  absl::Status mine = MayReachOwnNodeList(core_->local_callers().Of(*ctx), as_move);
  if (!mine.ok()) return ToGrpcStatus(mine);
  return ToGrpcStatus(
      core_->tensors().mover().Notify(*req, absl::FromChrono(ctx->deadline())));
}

absl::Status TensorService::MayReachOwnNodeList(const std::optional<LocalCaller>& caller,
                                                const ferry::v1::MoveBlocksRequest& req) {
  const LocalCallers& callers = core_->local_callers();
  if (req.peer() != core_->config().node || callers.SeesAll(caller)) return absl::OkStatus();
  auto list = core_->tensors().blocks().Exported(req.remote_list());
  if (!list.ok()) return absl::OkStatus();  // resolving it says so, as a peer would
  return callers.MayUse(caller, core_->sessions().UidOf((*list)->session()),
                        absl::StrCat("remote_list: list ", Echo(req.remote_list()),
                                     " of this node"));
}

grpc::Status TensorPeerService::ResolveBlocks(grpc::ServerContext* ctx,
                                              const ferry::v1::ResolveBlocksRequest* req,
                                              ferry::v1::ResolveBlocksResponse* resp) {
  absl::StatusOr<std::string> from = CallerNode(*ctx, req->from_node());
  if (!from.ok()) return ToGrpcStatus(from.status());
  auto resolved = core_->tensors().mover().Resolve(req->list(), *from, &core_->leases());
  if (!resolved.ok()) {
    return ToGrpcStatus(NoteRecentStart(resolved.status(), core_->config().node,
                                        core_->started(), core_->incarnation(), absl::Now()));
  }
  *resp = *std::move(resolved);
  return grpc::Status::OK;
}

grpc::Status TensorPeerService::ChecksumBlocks(grpc::ServerContext* ctx,
                                               const ferry::v1::ChecksumBlocksRequest* req,
                                               ferry::v1::ChecksumBlocksResponse* resp) {
  absl::StatusOr<std::string> from = CallerNode(*ctx, req->from_node());
  if (!from.ok()) return ToGrpcStatus(from.status());
  auto sums =
      core_->tensors().mover().Checksum(*req, *from, [ctx] { return ctx->IsCancelled(); });
  if (!sums.ok()) return ToGrpcStatus(sums.status());
  *resp = *std::move(sums);
  return grpc::Status::OK;
}

}  // namespace ferry::server
