#pragma once
// libferry's block lists: prepare an ordered list of blocks over registered memory or
// buffers (every layer's K and V cache cut into blocks), export it by name, and move any set
// of (local index -> remote index) pairs with a peer's list in one call, READ or WRITE,
// optionally notifying the peer once every block settled. MoveBlocks returns the transfer's
// id at once; Client::Poll, Wait and Cancel follow it (op i of its result is pair i). With
// `wait` it returns once the move ended: one round trip, over the agent's transfer socket
// for a BlockClient made on a Client that reaches it.
//
//   ferry::BlockClient blocks(client.get());
//   auto list = blocks.Prepare({{reg_k0, 0, 32768, 64}, {reg_v0, 0, 32768, 64}}, "kv");
//   auto moved = blocks.Move(ferry::v1::READ, list->list(), {0, 1}, "node-a", "kv", {7, 9},
//                            "req-17 pulled");

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/agent_session.h"
#include "ferry/v1/tensor.grpc.pb.h"

namespace ferry {

class Client;

class BlockClient {
 public:
  // Every call on gRPC.
  explicit BlockClient(std::shared_ptr<AgentSession> session);
  // On `client`'s session; a move with `wait` goes over its transfer socket where it reaches
  // one (Client::MoveOnSocket: no gRPC on the way), else gRPC. `client` must outlive this.
  explicit BlockClient(Client* client);

  // `name`: export the list to peers under it ("" for a list only this client moves).
  absl::StatusOr<ferry::v1::PrepareBlocksResponse> Prepare(
      const std::vector<ferry::v1::BlockExtent>& extents, const std::string& name = "");
  absl::Status Release(uint64_t list);
  // Starts moving local_blocks[i] <-> remote_blocks[i] of `peer`'s list `remote_list`.
  // `verify`: compare every pair's CRC32C on both sides before the transfer finishes.
  // `wait`: return once the transfer ended, its result in `result` (one call; its deadline
  // is `timeout_ms`, 60 s when 0, and 10 s more: a transfer still running then comes back
  // RUNNING, to follow by id). `notification_payload` (at most 4096 bytes) travels with
  // the notification (Notification.payload).
  absl::StatusOr<ferry::v1::MoveBlocksResponse> Move(ferry::v1::OpType type, uint64_t list,
                                                     const std::vector<uint64_t>& local_blocks,
                                                     const std::string& peer,
                                                     const std::string& remote_list,
                                                     const std::vector<uint64_t>& remote_blocks,
                                                     const std::string& notification = "",
                                                     uint32_t timeout_ms = 0,
                                                     bool verify = false, bool wait = false,
                                                     const std::string& notification_payload = "");
  // Delivers notification `name` (with `payload`, at most 4096 bytes) to the owner of
  // `peer`'s exported list `remote_list`, no move with it; returns once the peer's agent has
  // it, or within `timeout` with an error naming the peer (Tensors.Notify).
  absl::Status Notify(const std::string& peer, const std::string& remote_list,
                      const std::string& name, const std::string& payload = "",
                      absl::Duration timeout = absl::Seconds(10));

 private:
  // A call's context, with this session; its deadline `timeout` from now.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(30)) const;

  std::shared_ptr<AgentSession> session_;
  Client* const client_ = nullptr;  // for its transfer socket; null: gRPC only
  std::unique_ptr<ferry::v1::Tensors::Stub> stub_;
};

// A BlockExtent in one expression (`stride` 0: back to back).
ferry::v1::BlockExtent Extent(uint64_t buffer, uint64_t offset, uint64_t block_bytes,
                              uint64_t count, uint64_t stride = 0);

}  // namespace ferry
