#pragma once
// Everything an agent keeps for tensors: the receive matcher and notification board (the
// receiving side) and the sends and block batches in flight (the sending side). Other agents
// are reached through the agent's PeerDirectory, so a SIGHUP reload that adds or removes a
// peer does so for tensors too. The Tensors and TensorPeer services are views onto it.
//
// Sending side of Send, in steps: validate -> offer to the receiver's agent (Match, asked
// again every second so cancellation is noticed) -> WRITE the span straight into the
// landing buffer through the TransferEngine -> Complete. Whatever ends it early (deadline,
// client hung up, Cancel), the receiver's agent is told (CancelSend, or Complete with the
// error once bytes already in flight have settled).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "server/buffers/buffer_registry.h"
#include "server/engine/transfer_engine.h"
#include "server/peers/peer_directory.h"
#include "server/tensors/block_lists.h"
#include "server/tensors/block_mover.h"
#include "server/tensors/notification_board.h"
#include "server/tensors/recv_matcher.h"

namespace ferry::server {

class TensorState {
 public:
  // `peers` names the nodes tensors may go to and from (this node itself too, as
  // peers->self()) and holds the channels to them; it must outlive this.
  // `notifications_per_receiver`: NotificationBoard's capacity (limits key of that name).
  TensorState(PeerDirectory* peers, BufferRegistry* buffers, TransferEngine* engine,
              uint64_t max_op_bytes, size_t notifications_per_receiver = 65536);

  const std::string& node() const { return node_; }
  RecvMatcher& matcher() { return matcher_; }
  NotificationBoard& board() { return board_; }
  // Prepared block lists and the MoveBlocks / ResolveBlocks calls over them.
  BlockLists& blocks() { return *blocks_; }
  // For a hook that may run while this is torn down (a session closing then).
  std::shared_ptr<BlockLists> shared_blocks() const { return blocks_; }
  BlockMover& mover() { return mover_; }

  // `owner_uid` below: the local uid making the call (-1: not known, a caller over
  // local_tcp). What it starts is its own: only it, root or the admin group cancel or list
  // it (server/local/call_rules.h); a taker of -1 acts on everyone's.
  absl::StatusOr<ferry::v1::SendResponse> Send(const ferry::v1::SendRequest& req,
                                               int64_t owner_uid, absl::Time deadline,
                                               const CancelledFn& client_gone);
  absl::StatusOr<ferry::v1::RecvResponse> Recv(const ferry::v1::RecvRequest& req,
                                               int64_t owner_uid, absl::Time deadline,
                                               const CancelledFn& client_gone);
  absl::StatusOr<ferry::v1::WriteBlocksResponse> WriteBlocks(
      const ferry::v1::WriteBlocksRequest& req, int64_t owner_uid, absl::Time deadline,
      const CancelledFn& client_gone);
  // Cancels `taker`'s pending sends to and receives from (peer, tag). NOT_FOUND if there
  // were none; PERMISSION_DENIED if there were only another uid's.
  absl::StatusOr<ferry::v1::CancelResponse> Cancel(const std::string& peer, const std::string& tag,
                                                   int64_t taker);
  void ListPending(ferry::v1::ListPendingResponse* out, int64_t taker);

 private:
  struct ActiveSend {
    int64_t owner_uid = -1;
    std::atomic<bool> cancelled{false};
    std::atomic<const char*> state{"waiting for receive"};
    uint64_t bytes = 0;
  };

  // The timeout_ms of an engine Submit that should end by `deadline`: what is left of it,
  // at most the engine's limits.max_timeout (a send with no deadline of its own then ends
  // at that cap rather than being refused).
  uint32_t EngineTimeoutMs(absl::Time deadline) const;
  // A TensorPeer stub on the directory's channel to `node`, for one call's use (a send
  // keeps it to its end even if the peer is removed meanwhile); NOT_FOUND for a node that
  // is not a peer now.
  absl::StatusOr<std::unique_ptr<ferry::v1::TensorPeer::Stub>> Stub(const std::string& node);
  // Waits for transfer `id` to end (its own deadline bounds this) and returns its status.
  absl::Status AwaitTransfer(uint64_t id);
  // Best-effort messages to a peer that must go out even after our deadline passed.
  void Withdraw(ferry::v1::TensorPeer::Stub* stub, uint64_t send_id, const std::string& reason);
  absl::Status CompleteOnPeer(ferry::v1::TensorPeer::Stub* stub, uint64_t send_id,
                              const absl::Status& status);
  absl::Status NotifyPeer(ferry::v1::TensorPeer::Stub* stub, ferry::v1::Notification n);

  PeerDirectory* const peers_;
  const std::string node_;
  BufferRegistry* const buffers_;
  TransferEngine* const engine_;
  const uint64_t max_op_bytes_;
  RecvMatcher matcher_;
  NotificationBoard board_;
  const std::shared_ptr<BlockLists> blocks_;
  BlockMover mover_;  // after blocks_: uses it until it is gone

  absl::Mutex mu_;
  // This agent's sends in flight, by (peer, tag).
  std::map<std::pair<std::string, std::string>, std::shared_ptr<ActiveSend>> sends_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_send_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
