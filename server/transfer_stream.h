// Agent.TransferStream: many transfers over one call, answered as they end.
#pragma once

#include <functional>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "base/worker_pool.h"
#include "ferry/v1/agent.grpc.pb.h"

namespace ferry::server {

// What the stream asks of the agent for each request.
struct StreamCalls {
  // Validates it as Submit and starts it (a refusal is returned, and nothing moved), then
  // calls `answer` once with its result when it ended, on the thread that ended it (it must
  // not block). `answer` may run before `start` returns.
  std::function<absl::Status(const ferry::v1::TransferRequest& request,
                             std::function<void(ferry::v1::TransferResult result)> answer)>
      start;
  // Whether `start` may block (it would ask a peer to resolve a buffer): then it runs on a
  // starter thread, else on gRPC's thread at once (no hand-off). A hint: a revocation just
  // after the answer costs one blocking resolve where it runs.
  std::function<bool(const ferry::v1::TransferRequest& request)> may_block;
};

// At most this many of a stream's transfers run or wait to be answered at once; the next
// request is read when one is answered (so a client that sends without reading answers
// holds this much of the agent, not more).
inline constexpr size_t kStreamWindow = 1024;

// Threads a service keeps to start its streams' requests on (`starters` below): a stream's
// requests start one at a time, in order, so this many streams at once may wait on a peer.
inline constexpr size_t kStreamStarters = 4;

// The call's reactor: gRPC owns it until OnDone; transfers still running then keep what
// they answer into alive and answer nobody. A request that may block starts on `starters`,
// not on gRPC's callback threads; none starts once the call ended. `starters` must outlive
// the work queued on it (its destructor runs that work).
grpc::ServerBidiReactor<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>*
StartTransferStream(WorkerPool* starters, StreamCalls calls);

}  // namespace ferry::server
