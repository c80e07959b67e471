#pragma once
// A unary callback call that starts a transfer and answers once it ended (Agent.Transfer,
// Tensors.MoveBlocks with `wait`), with no thread waiting on it: the engine's finished hook
// answers. The reactor below is the one both use; unary_transfer.h and block_calls.cc say
// what each starts and answers.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/worker_pool.h"
#include "ferry/v1/agent.pb.h"

namespace ferry::server {

struct WaitingCall {
  // Validates and starts the transfer: its id, or a refusal (the call's status, and nothing
  // moved). `ended` is called once with the transfer's result when it ended, on the thread
  // that ended it, and must not block; it may run before `start` returns. A `start` that
  // answers at once (MoveBlocks without `wait`) calls `ended` itself before it returns.
  std::function<absl::StatusOr<uint64_t>(std::function<void(ferry::v1::TransferResult)> ended)>
      start;
  // The peer `start` may block on (it would ask it something): then it runs on a starter
  // thread, in that peer's lane (base/worker_pool.h); nullopt: on gRPC's thread at once (no
  // hand-off). A hint: a revocation just after costs one blocking call where it runs.
  std::function<std::optional<std::string>()> may_block;
  // Writes the answer into the call's response: once, after `start` returned (so `start`
  // may write the response's other fields) and before the call is finished.
  std::function<void(ferry::v1::TransferResult result)> respond;
  // When set: at that time the call answers with `as_it_stands(id)` (RUNNING) if the
  // transfer has not ended, and the transfer runs on (MoveBlocks: a failed call would lose
  // the id its caller follows it by). Unset: the call's deadline ends it with
  // DEADLINE_EXCEEDED naming the transfer.
  std::optional<absl::Time> answer_by;
  std::function<ferry::v1::TransferResult(uint64_t id)> as_it_stands;
};

// The call's reactor (gRPC owns it until OnDone). Starts `call` on this thread when
// `call.may_block()` says it will not block, else on `starters` (gRPC's callback threads
// must not block). A refusal is the call's status. When the call ends first, the transfer
// runs on (Cancel ends it) and the call answers DEADLINE_EXCEEDED naming the transfer if
// its deadline passed, else CANCELLED; a start still queued on `starters` then starts
// nothing. What `call` refers to (the request, the response) must live until OnDone, as
// gRPC promises for its messages; `starters` must outlive the work queued on it.
grpc::ServerUnaryReactor* StartWaitingCall(grpc::CallbackServerContext* ctx,
                                           WorkerPool* starters, WaitingCall call);

}  // namespace ferry::server
