// Agent.TransferStream: many transfers over one call, answered as they end.
#pragma once

#include <grpcpp/grpcpp.h>

#include "base/worker_pool.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "server/api/transfer_calls.h"

namespace ferry::server {

// At most this many of a stream's transfers run or wait to be answered at once; the next
// request is read when one is answered (so a client that sends without reading answers
// holds this much of the agent, not more).
inline constexpr size_t kStreamWindow = 1024;

// The call's reactor: gRPC owns it until OnDone; transfers still running then keep what
// they answer into alive and answer nobody. A request that may block starts on `starters`,
// not on gRPC's callback threads; none starts once the call ended. `starters` must outlive
// the work queued on it (its destructor runs that work).
grpc::ServerBidiReactor<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>*
StartTransferStream(WorkerPool* starters, std::shared_ptr<const TransferCalls> calls);

}  // namespace ferry::server
