#pragma once
// The gRPC channel to a node's ferryd, shared by every client of the local API.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace ferry {

// The socket of this host's agent when a client is told none: $FERRY_SOCKET when set and not
// empty, else /tmp/ferryd-<host name>.sock. ferryd's own default is /tmp/ferryd-<node>.sock
// with the node defaulting to the host name (config/config.cc ResolveDefaults), so the two
// meet wherever the agent's config names neither its node nor its socket.
std::string DefaultAgentSocket();

// `target`: a Unix socket path, or "unix:PATH" / "HOST:PORT" (the opt-in TCP listener);
// "" is DefaultAgentSocket(). UNAVAILABLE when no agent answers within `timeout`, at once
// when the socket file does not exist and no agent holds its lock (none is starting there):
// the message names the path, how to point at another agent, and the agents' sockets found
// beside it.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectAgentChannel(const std::string& target,
                                                                   absl::Duration timeout);

}  // namespace ferry
