#pragma once
// The gRPC channel to a node's ferryd, shared by every client of the local API.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace ferry {

// `target`: a Unix socket path, or "unix:PATH" / "HOST:PORT" (the opt-in TCP listener).
// UNAVAILABLE when no agent answers within `timeout`.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectAgentChannel(const std::string& target,
                                                                   absl::Duration timeout);

}  // namespace ferry
