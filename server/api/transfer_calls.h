#pragma once
// How the transfer calls that answer without a waiting thread (Agent.Transfer and
// Agent.TransferStream, both callback methods, and the transfer socket) reach the engine for
// each request, and the transfer socket's block moves and notification polls reach the block
// mover and the notification board: one object per caller, with named methods.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/agent.pb.h"
#include "ferry/v1/transfer_socket.pb.h"

namespace ferry::server {

// Threads a service keeps to start the requests that may block (`MayBlockOn` below), in
// one lane per peer (base/worker_pool.h), at most kStartersPerPeer of them on one peer: a
// peer that stops answering holds that many, and another peer's requests start on the rest
// (8 shared starters once let 16 transfers to a stopped node hold up a healthy node's batch
// for 59 s). A stream's requests start one at a time, in order.
inline constexpr size_t kTransferStarters = 32;
inline constexpr size_t kStartersPerPeer = 2;

// Called once with a transfer's result when it ended, on the thread that ended it: it must
// not block.
using AnswerFn = std::function<void(ferry::v1::TransferResult result)>;

// One caller's transfers, as a call surface starts them (AgentService::CallsFor makes one
// per caller, and holds what it may do: the caller is fixed when the call begins).
class TransferCalls {
 public:
  virtual ~TransferCalls() = default;
  // Validates `request` as Submit and starts it (a refusal is returned, and nothing moved;
  // else the transfer's id), then calls `answer` once with its result when it ended. `answer`
  // may run before Start returns, and may end the call and its request with it: Start does
  // not read the request once the transfer exists (the engine's Submit reads it only to
  // plan).
  virtual absl::StatusOr<uint64_t> Start(const ferry::v1::TransferRequest& request,
                                         AnswerFn answer) const = 0;
  // The peer Start may block on (it would ask it something): then it runs on a starter
  // thread, in that peer's lane; nullopt: it runs on the calling thread at once (no
  // hand-off). A hint: a revocation just after the answer costs one blocking call where it
  // runs.
  virtual std::optional<std::string> MayBlockOn(
      const ferry::v1::TransferRequest& request) const = 0;
};

// One caller's block moves on the transfer socket (SessionMove): as TransferCalls, for
// Tensors.MoveBlocks with `wait` in the session the move names (TensorService::MovesFor).
class MoveCalls {
 public:
  virtual ~MoveCalls() = default;
  // Checks the session against the caller, validates the move as MoveBlocks and starts it;
  // a refusal or the transfer's id, and `answer` once, as TransferCalls::Start.
  virtual absl::StatusOr<uint64_t> Start(const ferry::v1::SessionMove& move,
                                         AnswerFn answer) const = 0;
  // The peer Start may block on (it would ask it for its list or rails), as above.
  virtual std::optional<std::string> MayBlockOn(const ferry::v1::SessionMove& move) const = 0;
};

// One caller's notification polls on the transfer socket (SocketRequest.poll): as
// Tensors.PollNotifications, for the caller's uid (TensorService::PollsFor). Never blocks, so
// it answers on the socket's thread.
class PollCalls {
 public:
  virtual ~PollCalls() = default;
  // Takes the caller's pending notifications `request` matches, at once.
  virtual ferry::v1::PollNotificationsResponse Poll(
      const ferry::v1::PollNotificationsRequest& request) const = 0;
};

}  // namespace ferry::server
