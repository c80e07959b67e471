#pragma once
// A sync call that answers when a transfer ended (Agent.Wait, MoveBlocks with
// `wait`): the one wait loop they share.

#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "ferry/v1/agent.pb.h"
#include "server/engine/transfer.h"

namespace ferry::server {

// Blocks (the sync API) until `transfer` ends, the call's deadline passes (DEADLINE_EXCEEDED
// naming the transfer) or the client hangs up (CANCELLED); then its result, `page` of its
// per-op results. `until`: answer at that time with the result as it stands (RUNNING)
// instead of failing.
grpc::Status AwaitTransferResult(grpc::ServerContext* ctx, const Transfer& transfer,
                                 const ResultPage& page, ferry::v1::TransferResult* resp,
                                 std::optional<absl::Time> until = std::nullopt);

}  // namespace ferry::server
