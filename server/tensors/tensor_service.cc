#include "server/tensors/tensor_service.h"

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "server/agent/agent_core.h"
#include "server/peers/caller_identity.h"
#include "server/api/info_protos.h"
#include "server/local/own_node_access.h"
#include "server/local/session_call.h"
#include "server/tensors/tensor_meta.h"

namespace ferry::server {
namespace {

// Calls without a timeout and without a gRPC deadline still end: no handler waits forever.
constexpr absl::Duration kDefaultTimeout = absl::Seconds(60);

absl::Time CallDeadline(grpc::ServerContext* ctx, uint32_t timeout_ms) {
  absl::Time from_ctx = absl::FromChrono(ctx->deadline());
  absl::Duration timeout = timeout_ms > 0 ? absl::Milliseconds(timeout_ms) : kDefaultTimeout;
  return std::min(from_ctx, absl::Now() + timeout);
}

CancelledFn ClientGone(grpc::ServerContext* ctx) {
  return [ctx] { return ctx->IsCancelled(); };
}

// A draining agent takes no new sends or receives (server/agent/drain.h), said before any waits.
bool Draining(AgentCore* core, grpc::Status* refusal) {
  if (!core->engine().draining()) return false;
  *refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, kDrainingMessage);
  return true;
}

}  // namespace

int64_t TensorService::CallerUid(const grpc::ServerContext& ctx) const {
  return LocalCallers::OwnerUid(core_->local_callers().Of(ctx));
}

int64_t TensorService::ListedUid(const grpc::ServerContext& ctx) const {
  std::optional<LocalCaller> caller = core_->local_callers().Of(ctx);
  return core_->local_callers().SeesAll(caller) ? -1 : LocalCallers::OwnerUid(caller);
}

int64_t TensorPeerService::NotificationOwner(const ferry::v1::Notification& n) const {
  if (!n.list().empty()) {
    auto list = core_->tensors().blocks().Exported(n.list());
    if (list.ok()) return core_->sessions().UidOf((*list)->session());
  }
  if (!n.buffer().empty()) {
    auto buffer = core_->buffers().FindByName(n.buffer());
    if (buffer.ok()) return (*buffer)->owner_uid();
  }
  return NotificationBoard::kAnyone;
}

grpc::Status TensorService::Send(grpc::ServerContext* ctx, const ferry::v1::SendRequest* req,
                                 ferry::v1::SendResponse* resp) {
  if (grpc::Status refusal; Draining(core_, &refusal)) return refusal;
  if (absl::Status mine = MayUseBuffer(core_->local_callers(), *ctx, core_->buffers(),
                                       req->buffer(), "buffer");
      !mine.ok()) {
    return ToGrpcStatus(mine);
  }
  auto r = core_->tensors().Send(*req, CallerUid(*ctx), CallDeadline(ctx, req->timeout_ms()),
                                 ClientGone(ctx));
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status TensorService::Recv(grpc::ServerContext* ctx, const ferry::v1::RecvRequest* req,
                                 ferry::v1::RecvResponse* resp) {
  if (grpc::Status refusal; Draining(core_, &refusal)) return refusal;
  if (req->buffer() != 0) {
    // A tensor landing in a buffer writes it: the buffer must be the caller's to write.
    if (absl::Status mine = MayUseBuffer(core_->local_callers(), *ctx, core_->buffers(),
                                         req->buffer(), "buffer");
        !mine.ok()) {
      return ToGrpcStatus(mine);
    }
  }
  auto r = core_->tensors().Recv(*req, CallerUid(*ctx), CallDeadline(ctx, req->timeout_ms()),
                                 ClientGone(ctx));
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  if (resp->has_buffer()) {
    // The client maps the landing buffer like any other.
    auto buffer = core_->buffers().Get(resp->buffer().id(), "buffer");
    if (buffer.ok()) DescribeBuffer(**buffer, resp->mutable_buffer());
  }
  if (ctx->IsCancelled() && resp->allocated()) {
    // Nobody will get the response, so nobody would free the buffer.
    core_->buffers().Free(resp->buffer().id()).IgnoreError();
  } else if (resp->allocated()) {
    // The landing buffer is the receiving client's now: freed when its session ends.
    auto session = SessionOfCall(*ctx, core_->sessions(), core_->local_callers());
    if (session.ok() && *session != 0) {
      BufferOwner owner = core_->sessions().OwnerFor(*session);
      if (auto caller = core_->local_callers().Of(*ctx)) owner.uid = caller->uid;
      core_->buffers().Adopt(resp->buffer().id(), std::move(owner)).IgnoreError();
      auto buffer = core_->buffers().Get(resp->buffer().id(), "buffer");
      if (buffer.ok()) DescribeBuffer(**buffer, resp->mutable_buffer());
    }
  }
  return grpc::Status::OK;
}

grpc::Status TensorService::WriteBlocks(grpc::ServerContext* ctx,
                                        const ferry::v1::WriteBlocksRequest* req,
                                        ferry::v1::WriteBlocksResponse* resp) {
  if (grpc::Status refusal; Draining(core_, &refusal)) return refusal;
  if (absl::Status mine = MayUseBuffer(core_->local_callers(), *ctx, core_->buffers(),
                                       req->local_buffer(), "local_buffer");
      !mine.ok()) {
    return ToGrpcStatus(mine);
  }
  if (req->peer() == core_->config().node) {
    if (absl::Status mine = MayReachOwnNodeBuffer(core_->local_callers(),
                                                  core_->local_callers().Of(*ctx),
                                                  core_->buffers(), req->remote_buffer(),
                                                  "remote_buffer");
        !mine.ok()) {
      return ToGrpcStatus(mine);
    }
  }
  auto r = core_->tensors().WriteBlocks(*req, CallerUid(*ctx),
                                        CallDeadline(ctx, req->timeout_ms()), ClientGone(ctx));
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status TensorService::WaitNotification(grpc::ServerContext* ctx,
                                             const ferry::v1::WaitNotificationRequest* req,
                                             ferry::v1::Notification* resp) {
  if (req->name().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "name: must be set");
  }
  // A poll looks once: a deadline already passed answers after one look at the board.
  const absl::Time deadline =
      req->poll() ? absl::InfinitePast() : CallDeadline(ctx, req->timeout_ms());
  auto n = core_->tensors().board().Take(req->name(), req->from_node(), CallerUid(*ctx), deadline,
                                         ClientGone(ctx));
  if (!n.ok()) return ToGrpcStatus(n.status());
  if (n->code() != 0) {
    // The batch behind this notification failed: the waiter gets that as its status.
    return grpc::Status(static_cast<grpc::StatusCode>(n->code()),
                        absl::StrCat("batch '", n->name(), "' from ", n->from_node(),
                                     " did not land: ", n->message()));
  }
  *resp = *std::move(n);
  return grpc::Status::OK;
}

grpc::Status TensorService::StreamNotifications(
    grpc::ServerContext* ctx, const ferry::v1::StreamNotificationsRequest* req,
    grpc::ServerWriter<ferry::v1::Notification>* writer) {
  // A stream without a timeout runs until the client cancels it (or the agent stops).
  absl::Time deadline = req->timeout_ms() > 0
                            ? std::min(absl::FromChrono(ctx->deadline()),
                                       absl::Now() + absl::Milliseconds(req->timeout_ms()))
                            : absl::FromChrono(ctx->deadline());
  uint32_t sent = 0;
  const int64_t taker = CallerUid(*ctx);
  while (!ctx->IsCancelled() && absl::Now() < deadline) {
    auto n = core_->tensors().board().TakePrefix(
        req->prefix(), taker, std::min(deadline, absl::Now() + absl::Milliseconds(200)));
    if (!n) continue;
    if (!writer->Write(*n)) {
      // Not delivered: put it back for the next taker of this uid.
      core_->tensors().board().Post(*std::move(n), taker);
      return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    if (req->max_count() > 0 && ++sent >= req->max_count()) break;
  }
  return grpc::Status::OK;
}

grpc::Status TensorService::PollNotifications(grpc::ServerContext* ctx,
                                              const ferry::v1::PollNotificationsRequest* req,
                                              ferry::v1::PollNotificationsResponse* resp) {
  *resp = core_->tensors().board().Poll(req->prefix(), req->max_count(), CallerUid(*ctx));
  return grpc::Status::OK;
}

grpc::Status TensorService::Cancel(grpc::ServerContext* ctx, const ferry::v1::CancelRequest* req,
                                   ferry::v1::CancelResponse* resp) {
  auto r = core_->tensors().Cancel(req->peer(), req->tag(), ListedUid(*ctx));
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *r;
  return grpc::Status::OK;
}

grpc::Status TensorService::ListPending(grpc::ServerContext* ctx,
                                        const ferry::v1::ListPendingRequest*,
                                        ferry::v1::ListPendingResponse* resp) {
  core_->tensors().ListPending(resp, ListedUid(*ctx));
  return grpc::Status::OK;
}

grpc::Status TensorPeerService::Match(grpc::ServerContext* ctx, const ferry::v1::MatchRequest* req,
                                      ferry::v1::MatchResponse* resp) {
  if (req->from_node().empty() || req->meta().tag().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "from_node and meta.tag must be set");
  }
  absl::StatusOr<std::string> from = CallerNode(*ctx, req->from_node());
  if (!from.ok()) return ToGrpcStatus(from.status());
  // The receiving side checks the meta itself rather than trusting the sender's agent.
  auto span = tensors::TensorSpanBytes(req->meta(), "meta");
  if (!span.ok()) return ToGrpcStatus(span.status());
  if (*span != req->bytes()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("bytes: ", req->bytes(), " does not match meta (", *span, ")"));
  }
  absl::Time wait_until =
      std::min(absl::FromChrono(ctx->deadline()),
               absl::Now() + absl::Milliseconds(std::min(req->wait_ms(), 5000u)));
  auto landing = core_->tensors().matcher().Offer(*from, req->send_id(), req->meta(),
                                                  req->bytes(),
                                                  absl::FromUnixMillis(req->deadline_unix_ms()),
                                                  wait_until);
  if (!landing.ok()) return ToGrpcStatus(landing.status());
  if (landing->has_value()) {
    resp->set_matched(true);
    resp->set_landing_buffer((*landing)->buffer_name);
    resp->set_landing_offset((*landing)->offset);
  }
  return grpc::Status::OK;
}

grpc::Status TensorPeerService::Complete(grpc::ServerContext* ctx,
                                         const ferry::v1::CompleteRequest* req,
                                         ferry::v1::CompleteResponse*) {
  absl::StatusOr<std::string> from = CallerNode(*ctx, req->from_node());
  if (!from.ok()) return ToGrpcStatus(from.status());
  absl::Status status(static_cast<absl::StatusCode>(req->code()), req->message());
  return ToGrpcStatus(core_->tensors().matcher().Complete(*from, req->send_id(), status));
}

grpc::Status TensorPeerService::CancelSend(grpc::ServerContext* ctx,
                                           const ferry::v1::CancelSendRequest* req,
                                           ferry::v1::CancelSendResponse*) {
  absl::StatusOr<std::string> from = CallerNode(*ctx, req->from_node());
  if (!from.ok()) return ToGrpcStatus(from.status());
  core_->tensors().matcher().Withdraw(*from, req->send_id(), req->reason());
  return grpc::Status::OK;
}

grpc::Status TensorPeerService::Notify(grpc::ServerContext* ctx, const ferry::v1::Notification* req,
                                       ferry::v1::NotifyResponse*) {
  if (req->name().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "name: must be set");
  }
  if (absl::Status payload = CheckNotificationPayload(req->payload(), req->name(), "payload");
      !payload.ok()) {
    return ToGrpcStatus(payload);
  }
  // A consumer waits for a batch from a named node: only that node can say it arrived.
  absl::StatusOr<std::string> from = CallerNode(*ctx, req->from_node());
  if (!from.ok()) return ToGrpcStatus(from.status());
  ferry::v1::Notification posted = *req;
  posted.set_from_node(*from);
  core_->tensors().board().Post(posted, NotificationOwner(*req));
  return grpc::Status::OK;
}

}  // namespace ferry::server
