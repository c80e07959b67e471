#pragma once
// What the transfer calls that answer without a waiting thread (Agent.Transfer and
// Agent.TransferStream, both callback methods, and the transfer socket) ask of the agent for
// each request; and what the transfer socket's block moves ask.

#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "ferry/v1/agent.pb.h"
#include "ferry/v1/transfer_socket.pb.h"

namespace ferry::server {

// Threads a service keeps to start the requests that may block on (`may_block` below): a
// stream's requests start one at a time, in order, so this many streams and Transfer calls
// at once may wait on a peer; the rest start at once or queue.
inline constexpr size_t kTransferStarters = 8;

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
  // Whether `start` may block (it would ask a peer something): then it runs on a starter
  // thread, else on gRPC's thread at once (no hand-off). A hint: a revocation just after
  // the answer costs one blocking call where it runs.
  std::function<bool(const ferry::v1::TransferRequest& request)> may_block;
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
  // Whether `start` may block (it would ask the peer for its list or rails).
  std::function<bool(const ferry::v1::SessionMove& move)> may_block;
};

}  // namespace ferry::server
