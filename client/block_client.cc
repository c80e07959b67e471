#include "client/block_client.h"

#include <algorithm>

#include "base/grpc_status.h"
#include "client/ferry_client.h"

namespace ferry {

BlockClient::BlockClient(std::shared_ptr<AgentSession> session)
    : session_(std::move(session)), stub_(ferry::v1::Tensors::NewStub(session_->channel())) {}

BlockClient::BlockClient(Client* client)
    : session_(client->shared_session()),
      client_(client),
      stub_(ferry::v1::Tensors::NewStub(session_->channel())) {}

std::unique_ptr<grpc::ClientContext> BlockClient::Context(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  session_->Attach(ctx.get());
  return ctx;
}

absl::StatusOr<ferry::v1::PrepareBlocksResponse> BlockClient::Prepare(
    const std::vector<ferry::v1::BlockExtent>& extents, const std::string& name) {
  ferry::v1::PrepareBlocksRequest req;
  for (const auto& e : extents) *req.add_extents() = e;
  req.set_name(name);
  ferry::v1::PrepareBlocksResponse resp;
  auto ctx = Context();
  grpc::Status s = stub_->PrepareBlocks(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::Status BlockClient::Release(uint64_t list) {
  ferry::v1::ReleaseBlocksRequest req;
  req.set_list(list);
  ferry::v1::ReleaseBlocksResponse resp;
  auto ctx = Context();
  return FromGrpcStatus(stub_->ReleaseBlocks(ctx.get(), req, &resp));
}

absl::StatusOr<ferry::v1::MoveBlocksResponse> BlockClient::Move(
    ferry::v1::OpType type, uint64_t list, const std::vector<uint64_t>& local_blocks,
    const std::string& peer, const std::string& remote_list,
    const std::vector<uint64_t>& remote_blocks, const std::string& notification,
    uint32_t timeout_ms, bool verify, bool wait, const std::string& notification_payload) {
  ferry::v1::MoveBlocksRequest req;
  req.set_type(type);
  req.set_list(list);
  req.mutable_local_blocks()->Add(local_blocks.begin(), local_blocks.end());
  req.set_peer(peer);
  req.set_remote_list(remote_list);
  req.mutable_remote_blocks()->Add(remote_blocks.begin(), remote_blocks.end());
  req.set_notification(notification);
  req.set_notification_payload(notification_payload);
  req.set_timeout_ms(timeout_ms);
  req.set_verify(verify);
  req.set_wait(wait);
  // Waiting, the transfer's own timeout ends it first (the agent's default is 60 s).
  const absl::Duration call_timeout =
      wait ? absl::Milliseconds(timeout_ms == 0 ? 60000 : timeout_ms) + absl::Seconds(10)
           : absl::Seconds(30);
  if (wait && client_ != nullptr) {
    auto moved = client_->MoveOnSocket(req, call_timeout);
    if (moved.has_value()) return *std::move(moved);
  }
  ferry::v1::MoveBlocksResponse resp;
  auto ctx = Context(call_timeout);
  grpc::Status s = stub_->MoveBlocks(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::Status BlockClient::Notify(const std::string& peer, const std::string& remote_list,
                                 const std::string& name, const std::string& payload,
                                 absl::Duration timeout) {
  ferry::v1::NotifyRequest req;
  req.set_peer(peer);
  req.set_remote_list(remote_list);
  req.set_name(name);
  req.set_payload(payload);
  req.set_timeout_ms(static_cast<uint32_t>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 1, UINT32_MAX)));
  ferry::v1::NotifyResult resp;
  // The agent ends the call within `timeout` and says why; the deadline guards against an
  // agent that stopped answering.
  auto ctx = Context(timeout + absl::Seconds(5));
  return FromGrpcStatus(stub_->Notify(ctx.get(), req, &resp));
}

ferry::v1::BlockExtent Extent(uint64_t buffer, uint64_t offset, uint64_t block_bytes,
                              uint64_t count, uint64_t stride) {
  ferry::v1::BlockExtent e;
  e.set_buffer(buffer);
  e.set_offset(offset);
  e.set_block_bytes(block_bytes);
  e.set_count(count);
  e.set_stride(stride);
  return e;
}

}  // namespace ferry
