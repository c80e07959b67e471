#include "client/tensor_client.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "client/agent_channel.h"
#include "grpcpp/grpcpp.h"

namespace ferry {

// Attaches a ClientContext to a canceller for the duration of one call.
class CallScope {
 public:
  CallScope(const CallOptions& options, grpc::ClientContext* ctx) : canceller_(options.canceller) {
    // The agent enforces `timeout` and says so in words; the gRPC deadline only guards
    // against an agent that stopped answering.
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + options.timeout + absl::Seconds(5)));
    if (canceller_) {
      absl::MutexLock lock(&canceller_->mu_);
      canceller_->ctx_ = ctx;
      if (canceller_->cancelled_) ctx->TryCancel();
    }
  }
  ~CallScope() {
    if (canceller_) {
      absl::MutexLock lock(&canceller_->mu_);
      canceller_->ctx_ = nullptr;
    }
  }

 private:
  std::shared_ptr<CallCanceller> canceller_;
};

namespace {

uint32_t TimeoutMs(const CallOptions& options) {
  int64_t ms = absl::ToInt64Milliseconds(options.timeout);
  return static_cast<uint32_t>(std::clamp<int64_t>(ms, 1, UINT32_MAX));
}

}  // namespace

void CallCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (ctx_ != nullptr) ctx_->TryCancel();
}

bool CallCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

ferry::v1::TensorMeta MakeMeta(ferry::v1::DType dtype, std::vector<int64_t> shape, std::string tag,
                               std::vector<int64_t> strides, std::string device) {
  ferry::v1::TensorMeta meta;
  meta.set_dtype(dtype);
  for (int64_t d : shape) meta.add_shape(d);
  for (int64_t s : strides) meta.add_strides(s);
  meta.set_tag(std::move(tag));
  meta.set_device(std::move(device));
  return meta;
}

absl::StatusOr<std::unique_ptr<TensorClient>> TensorClient::Connect(const std::string& target,
                                                                    absl::Duration timeout) {
  auto session = AgentSession::Open(target, timeout, "libferry tensors");
  if (!session.ok()) return session.status();
  return std::make_unique<TensorClient>(*std::move(session));
}

TensorClient::TensorClient(std::shared_ptr<AgentSession> session)
    : session_(std::move(session)), stub_(ferry::v1::Tensors::NewStub(session_->channel())) {}

absl::StatusOr<ferry::v1::SendResponse> TensorClient::Send(uint64_t buffer, uint64_t offset,
                                                           const ferry::v1::TensorMeta& meta,
                                                           const std::string& peer,
                                                           const CallOptions& options) {
  ferry::v1::SendRequest req;
  req.set_buffer(buffer);
  req.set_offset(offset);
  *req.mutable_meta() = meta;
  req.set_peer(peer);
  req.set_timeout_ms(TimeoutMs(options));
  ferry::v1::SendResponse resp;
  grpc::ClientContext ctx;
  CallScope scope(options, &ctx);
  grpc::Status s = stub_->Send(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<ReceivedTensor> TensorClient::Recv(const std::string& peer, const std::string& tag,
                                                  const RecvOptions& recv,
                                                  const CallOptions& options) {
  ferry::v1::RecvRequest req;
  req.set_peer(peer);
  req.set_tag(tag);
  req.set_buffer(recv.buffer);
  req.set_offset(recv.offset);
  *req.mutable_expect() = recv.expect;
  req.set_timeout_ms(TimeoutMs(options));
  ferry::v1::RecvResponse resp;
  grpc::ClientContext ctx;
  session_->Attach(&ctx);  // a landing buffer the agent allocates becomes ours
  CallScope scope(options, &ctx);
  grpc::Status s = stub_->Recv(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  ReceivedTensor out;
  out.meta = resp.meta();
  out.offset = resp.offset();
  out.bytes = resp.bytes();
  out.allocated = resp.allocated();
  if (resp.has_buffer()) {
    auto mapped = Buffer::Map(resp.buffer());
    if (!mapped.ok()) return mapped.status();
    out.buffer = *std::move(mapped);
  }
  return out;
}

absl::StatusOr<ferry::v1::WriteBlocksResponse> TensorClient::WriteBlocks(
    uint64_t local_buffer, const std::string& peer, const std::string& remote_buffer,
    const std::vector<BlockSpec>& blocks, const std::string& notification,
    const CallOptions& options) {
  ferry::v1::WriteBlocksRequest req;
  req.set_local_buffer(local_buffer);
  req.set_peer(peer);
  req.set_remote_buffer(remote_buffer);
  req.mutable_blocks()->Reserve(static_cast<int>(blocks.size()));
  for (const BlockSpec& b : blocks) {
    auto* block = req.add_blocks();
    block->set_local_offset(b.local_offset);
    block->set_remote_offset(b.remote_offset);
    block->set_length(b.length);
  }
  req.set_notification(notification);
  req.set_timeout_ms(TimeoutMs(options));
  ferry::v1::WriteBlocksResponse resp;
  grpc::ClientContext ctx;
  CallScope scope(options, &ctx);
  grpc::Status s = stub_->WriteBlocks(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<ferry::v1::Notification> TensorClient::WaitNotification(const std::string& name,
                                                                       const std::string& from_node,
                                                                       const CallOptions& options) {
  ferry::v1::WaitNotificationRequest req;
  req.set_name(name);
  req.set_from_node(from_node);
  req.set_timeout_ms(TimeoutMs(options));
  ferry::v1::Notification resp;
  grpc::ClientContext ctx;
  CallScope scope(options, &ctx);
  grpc::Status s = stub_->WaitNotification(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

NotificationStream::~NotificationStream() {
  if (reader_ && !done_) {
    ctx_.TryCancel();
    reader_->Finish().ok();
  }
}

absl::StatusOr<std::optional<ferry::v1::Notification>> NotificationStream::Next() {
  if (done_) return std::nullopt;
  ferry::v1::Notification n;
  if (reader_->Read(&n)) return n;
  done_ = true;
  grpc::Status s = reader_->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  return std::nullopt;
}

void NotificationStream::Cancel() { ctx_.TryCancel(); }

std::unique_ptr<NotificationStream> TensorClient::OpenNotifications(const std::string& prefix,
                                                                    absl::Duration timeout,
                                                                    uint32_t max_count) {
  auto stream = std::unique_ptr<NotificationStream>(new NotificationStream());
  ferry::v1::StreamNotificationsRequest req;
  req.set_prefix(prefix);
  req.set_max_count(max_count);
  if (timeout > absl::ZeroDuration()) {
    req.set_timeout_ms(static_cast<uint32_t>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 1, UINT32_MAX)));
    stream->ctx_.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
  }
  stream->reader_ = stub_->StreamNotifications(&stream->ctx_, req);
  return stream;
}

absl::StatusOr<ferry::v1::CancelResponse> TensorClient::Cancel(const std::string& peer,
                                                               const std::string& tag) {
  ferry::v1::CancelRequest req;
  req.set_peer(peer);
  req.set_tag(tag);
  ferry::v1::CancelResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = stub_->Cancel(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<ferry::v1::ListPendingResponse> TensorClient::ListPending() {
  ferry::v1::ListPendingResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = stub_->ListPending(&ctx, {}, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

}  // namespace ferry
