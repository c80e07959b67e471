#pragma once
// What the transfer calls that answer without a waiting thread (Agent.Transfer and
// Agent.TransferStream, both callback methods, and the transfer socket) ask of the agent for
// each request; and what the transfer socket's block moves ask.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/agent.pb.h"
#include "ferry/v1/transfer_socket.pb.h"

namespace ferry::server {

// Threads a service keeps to start the requests that may block (`may_block` below), in
// one lane per peer (base/worker_pool.h), at most kStartersPerPeer of them on one peer: a
// peer that stops answering holds that many, and another peer's requests start on the rest
// (8 shared starters once let 16 transfers to a stopped node hold up a healthy node's batch
// for 59 s). A stream's requests start one at a time, in order.
inline constexpr size_t kTransferStarters = 32;
inline constexpr size_t kStartersPerPeer = 2;

struct TransferCalls {
  // Validates it as Submit and starts it (a refusal is returned, and nothing moved; else
  // the transfer's id), then calls `answer` once with its result when it ended, on the
  // thread that ended it (it must not block). `answer` may run before `start` returns, and
  // may end the call and its request with it: `start` does not read the request once the
  // transfer exists (the engine's Submit reads it only to plan).
  std::function<absl::StatusOr<uint64_t>(
      const ferry::v1::TransferRequest& request,
      std::function<void(ferry::v1::TransferResult result)> answer)>
      start;
  // The peer `start` may block on (it would ask it something): then it runs on a starter
  // thread, in that peer's lane; nullopt: it runs on gRPC's thread at once (no hand-off). A
  // hint: a revocation just after the answer costs one blocking call where it runs.
  std::function<std::optional<std::string>(const ferry::v1::TransferRequest& request)>
      may_block;
};

// A block move on the transfer socket (SessionMove): as TransferCalls, for Tensors.MoveBlocks
// with `wait` in the session the move names (TensorService::MovesFor).
struct MoveCalls {
  // Checks the session against the caller, validates the move as MoveBlocks and starts it
  // (a refusal is returned, and nothing moved; else the transfer's id); `answer` as in
  // TransferCalls::start, once, with the move's result.
  std::function<absl::StatusOr<uint64_t>(
      const ferry::v1::SessionMove& move,
      std::function<void(ferry::v1::TransferResult result)> answer)>
      start;
  // The peer `start` may block on (it would ask it for its list or rails), as above.
  std::function<std::optional<std::string>(const ferry::v1::SessionMove& move)> may_block;
};

}  // namespace ferry::server
