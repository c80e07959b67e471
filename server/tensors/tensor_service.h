#pragma once
// The Tensors gRPC service (local clients) and the TensorPeer service (other agents). Thin:
// compute the call's deadline, call TensorState, convert the status. Sync handlers that wait
// (Send, Recv, WriteBlocks, WaitNotification, Match) are bounded by that deadline and poll
// for a client that hung up.

#include "base/worker_pool.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "server/local/local_callers.h"
#include "server/api/transfer_calls.h"

namespace ferry::server {

class AgentCore;

class TensorService final
    : public ferry::v1::Tensors::WithCallbackMethod_MoveBlocks<ferry::v1::Tensors::Service> {
 public:
  explicit TensorService(AgentCore* core) : core_(core) {}

  grpc::Status Send(grpc::ServerContext*, const ferry::v1::SendRequest*,
                    ferry::v1::SendResponse*) override;
  grpc::Status Recv(grpc::ServerContext*, const ferry::v1::RecvRequest*,
                    ferry::v1::RecvResponse*) override;
  grpc::Status WriteBlocks(grpc::ServerContext*, const ferry::v1::WriteBlocksRequest*,
                           ferry::v1::WriteBlocksResponse*) override;
  grpc::Status WaitNotification(grpc::ServerContext*, const ferry::v1::WaitNotificationRequest*,
                                ferry::v1::Notification*) override;
  grpc::Status StreamNotifications(grpc::ServerContext*,
                                   const ferry::v1::StreamNotificationsRequest*,
                                   grpc::ServerWriter<ferry::v1::Notification>*) override;
  grpc::Status PollNotifications(grpc::ServerContext*,
                                 const ferry::v1::PollNotificationsRequest*,
                                 ferry::v1::PollNotificationsResponse*) override;
  grpc::Status Cancel(grpc::ServerContext*, const ferry::v1::CancelRequest*,
                      ferry::v1::CancelResponse*) override;
  // block_calls.cc: prepared block lists.
  grpc::Status PrepareBlocks(grpc::ServerContext*, const ferry::v1::PrepareBlocksRequest*,
                             ferry::v1::PrepareBlocksResponse*) override;
  grpc::Status ReleaseBlocks(grpc::ServerContext*, const ferry::v1::ReleaseBlocksRequest*,
                             ferry::v1::ReleaseBlocksResponse*) override;
  // A callback method (server/api/waiting_call.h): no thread waits for a move with `wait`.
  grpc::ServerUnaryReactor* MoveBlocks(grpc::CallbackServerContext*,
                                       const ferry::v1::MoveBlocksRequest*,
                                       ferry::v1::MoveBlocksResponse*) override;
  // block_calls.cc: a notification alone to a peer's list owner (a sync call: it waits for
  // the peer, within its timeout).
  grpc::Status Notify(grpc::ServerContext*, const ferry::v1::NotifyRequest*,
                      ferry::v1::NotifyResult*) override;
  grpc::Status ListPending(grpc::ServerContext*, const ferry::v1::ListPendingRequest*,
                           ferry::v1::ListPendingResponse*) override;
  // socket_moves.cc: what `caller`'s block moves on the transfer socket do (MoveBlocks with
  // `wait`, in the session each names: the caller's own, or it is privileged).
  std::shared_ptr<const MoveCalls> MovesFor(const LocalCaller& caller);
  // socket_polls.cc: `caller`'s notification polls on the transfer socket (its uid's
  // notifications, as PollNotifications takes them).
  std::shared_ptr<const PollCalls> PollsFor(const LocalCaller& caller);

 private:
  class CallerMoves;  // MovesFor's calls

  // The caller's uid, owner of what it starts and taker of its notifications (-1: a
  // caller over local_tcp, known by its certificate only).
  int64_t CallerUid(const grpc::ServerContext& ctx) const;
  // Whose pending sends and receives the caller lists and cancels: its uid's, or -1 (every
  // uid's) for root, the admin group and local_tcp.
  int64_t ListedUid(const grpc::ServerContext& ctx) const;
  // PERMISSION_DENIED naming remote_list when `req` moves to or from a list of this node
  // itself that `caller` may not use (server/local/own_node_access.h says why).
  absl::Status MayReachOwnNodeList(const std::optional<LocalCaller>& caller,
                                   const ferry::v1::MoveBlocksRequest& req);

  AgentCore* const core_;
  // MoveBlocks' starts that would ask a peer (its list, or the buffers it names); last, so
  // it runs its queue before the rest goes.
  WorkerPool starters_{kTransferStarters, "ferry-start", kStartersPerPeer};
};

class TensorPeerService final : public ferry::v1::TensorPeer::Service {
 public:
  explicit TensorPeerService(AgentCore* core) : core_(core) {}

  grpc::Status Match(grpc::ServerContext*, const ferry::v1::MatchRequest*,
                     ferry::v1::MatchResponse*) override;
  grpc::Status Complete(grpc::ServerContext*, const ferry::v1::CompleteRequest*,
                        ferry::v1::CompleteResponse*) override;
  grpc::Status CancelSend(grpc::ServerContext*, const ferry::v1::CancelSendRequest*,
                          ferry::v1::CancelSendResponse*) override;
  grpc::Status ResolveBlocks(grpc::ServerContext*, const ferry::v1::ResolveBlocksRequest*,
                             ferry::v1::ResolveBlocksResponse*) override;  // block_calls.cc
  grpc::Status ChecksumBlocks(grpc::ServerContext*, const ferry::v1::ChecksumBlocksRequest*,
                              ferry::v1::ChecksumBlocksResponse*) override;  // block_calls.cc
  grpc::Status Notify(grpc::ServerContext*, const ferry::v1::Notification*,
                      ferry::v1::NotifyResponse*) override;

 private:
  // Who a peer's notification is for: the uid owning the list or buffer it names here.
  int64_t NotificationOwner(const ferry::v1::Notification& n) const;

  AgentCore* const core_;
};

}  // namespace ferry::server
