// Agent.TransferStream: many transfers over one call, answered as they end.
#pragma once

#include <functional>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "ferry/v1/agent.grpc.pb.h"

namespace ferry::server {

// What the stream asks of the agent for each request: validate it as Submit and start it
// (a refusal is returned, and nothing moved), then call `answer` once with its result when
// it ended, on the thread that ended it (it must not block). `answer` may run before
// StartTransfer returns.
using StartTransfer = std::function<absl::Status(
    const ferry::v1::TransferRequest& request,
    std::function<void(ferry::v1::TransferResult result)> answer)>;

// At most this many of a stream's transfers run or wait to be answered at once; the next
// request is read when one is answered (so a client that sends without reading answers
// holds this much of the agent, not more).
inline constexpr size_t kStreamWindow = 1024;

// The call's reactor: gRPC owns it until OnDone; transfers still running then keep what
// they answer into alive and answer nobody.
grpc::ServerBidiReactor<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>*
StartTransferStream(StartTransfer start);

}  // namespace ferry::server
