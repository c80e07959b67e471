#pragma once
// MoveBlocks: (local index -> remote index) pairs between a prepared list and a peer's
// exported one, as one engine transfer whose op i is pair i; and ResolveBlocks, the peer's
// side, which says where an exported list's blocks are (and, for verify, what they hold).
// The peer's answer is kept while it says it will revoke it (ResolveBlocksResponse.
// revocable), so a MoveBlocks to a list moved to before asks the peer nothing.
// The notification goes out when the transfer finished, from the engine's completion hook
// through the NotifySender: no thread waits for any transfer.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/v1/tensor.pb.h"
#include "server/buffers/buffer_registry.h"
#include "server/engine/transfer_engine.h"
#include "server/peers/export_leases.h"
#include "server/peers/peer_directory.h"
#include "server/tensors/block_lists.h"
#include "server/tensors/block_verifier.h"
#include "server/tensors/notify_sender.h"

namespace ferry::server {

class BlockMover {
 public:
  using Finished = std::function<void(const ferry::v1::TransferResult&)>;

  BlockMover(PeerDirectory* peers, BufferRegistry* buffers, TransferEngine* engine,
             BlockLists* lists)
      : peers_(peers), buffers_(buffers), engine_(engine), lists_(lists),
        notifier_(std::make_shared<NotifySender>(peers)), verifier_(peers, buffers->gpus()) {}
  // Ends the checks not made (their transfers fail UNAVAILABLE), then delivers the
  // notifications already queued; later hooks queue nothing.
  ~BlockMover() {
    verifier_.Stop();
    notifier_->Stop();
  }

  // Validates the whole request (MoveBlocks in tensor.proto says how it is refused), asks
  // the peer where its blocks are (by `deadline` and within `timeout_ms`, which the transfer
  // then has what is left of; DEADLINE_EXCEEDED "remote_list: <peer> did not answer
  // ResolveBlocks within <t>" else) and submits the transfer; returns at once.
  // `then`, if given, runs with the transfer's result when it finished, after the move's own
  // hook (the notification queued), as the engine's finished hooks do: it must not block.
  // `owner_uid`: the session's uid, who may then Wait on, Cancel and list the transfer.
  absl::StatusOr<ferry::v1::MoveBlocksResponse> Move(const ferry::v1::MoveBlocksRequest& req,
                                                     uint64_t session, int64_t owner_uid,
                                                     uint32_t timeout_ms, absl::Time deadline,
                                                     Finished then = {});
  // Tensors.Notify: resolves `req.remote_list` at `req.peer` as Move does (by `deadline`
  // and within timeout_ms, 10 s when 0), then delivers the notification to the peer's agent
  // (Notification.list = remote_list, no blocks, code OK) and returns once it has it.
  // Errors name the peer (PeerCallError); NOT_FOUND for a list it does not have. Blocks:
  // the caller runs it on a thread that may wait.
  absl::Status Notify(const ferry::v1::NotifyRequest& req, absl::Time deadline);
  // Whether Move(req) may block: it would ask the peer for its list or the buffers the list
  // names, or for its rails (PeerDirectory::Kept, RailsFresh). A hint, for callers that
  // must not block to choose where to move; an unknown peer is refused without a call.
  bool MayAskPeer(const ferry::v1::MoveBlocksRequest& req);
  // The extents of the list exported as `name`, for peer `caller`. NOT_FOUND when there is
  // none, a buffer of it was freed, or one is not exported to `caller`. Revocable when
  // `leases` may grant it to `caller`: the list's name and its buffers' are granted first.
  absl::StatusOr<ferry::v1::ResolveBlocksResponse> Resolve(const std::string& name,
                                                           const std::string& caller,
                                                           ExportLeases* leases) const;
  // The CRC32C of blocks `req.blocks` of the list exported as `req.list`, for peer `caller`
  // (ChecksumBlocks in tensor.proto says how it is refused). Stops, CANCELLED, once
  // `cancelled` says the caller went.
  absl::StatusOr<ferry::v1::ChecksumBlocksResponse> Checksum(
      const ferry::v1::ChecksumBlocksRequest& req, const std::string& caller,
      const std::function<bool()>& cancelled) const;
  const NotifySender& notifier() const { return *notifier_; }

 private:
  absl::StatusOr<ferry::v1::ResolveBlocksResponse> AskPeer(const std::string& node,
                                                           const std::string& list,
                                                           absl::Time deadline);
  // Move, once the peer's answer for its list is at hand: the pairs as ops, submitted.
  absl::StatusOr<ferry::v1::MoveBlocksResponse> MoveOn(const ferry::v1::MoveBlocksRequest& req,
                                                       const BlockList& list,
                                                       std::shared_ptr<const RemoteList> remote,
                                                       int64_t owner_uid, uint32_t timeout_ms,
                                                       Finished then);
  // The peer's answer for `list`: the kept one (no call), else AskPeer's, kept when the
  // peer said it revokes it. UNAVAILABLE when it was revoked on its way every time.
  absl::StatusOr<std::shared_ptr<const RemoteList>> RemoteListOf(const std::string& node,
                                                                 const std::string& list,
                                                                 absl::Time deadline);

  PeerDirectory* const peers_;
  BufferRegistry* const buffers_;
  TransferEngine* const engine_;
  BlockLists* const lists_;
  // Shared with the engine's hooks, which may run after this is gone (the agent stopping
  // fails the transfers still running): they find it stopped and queue nothing.
  const std::shared_ptr<NotifySender> notifier_;
  BlockVerifier verifier_;
};

}  // namespace ferry::server
