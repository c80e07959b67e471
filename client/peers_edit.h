#pragma once
// `ferryctl peers add NODE HOST:PORT` and `ferryctl peers remove NODE`: run-time peers
// (Agent.AddPeer / RemovePeer). The listing, `ferryctl peers`, is the peers view's.

#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/agent.grpc.pb.h"

namespace ferry::client {

// AddPeer(node, address); the agent's refusal as its status (the message names the field).
absl::StatusOr<ferry::v1::PeerChange> AddPeer(ferry::v1::Agent::Stub& stub,
                                              const std::string& node,
                                              const std::string& address);
absl::StatusOr<ferry::v1::PeerChange> RemovePeer(ferry::v1::Agent::Stub& stub,
                                                 const std::string& node);

// One line for the operator: "peer node-d added at 10.0.0.4:7100" or "node-d: no change
// (runtime, at 10.0.0.4:7100)".
std::string FormatPeerChange(const std::string& node, const ferry::v1::PeerChange& change);

}  // namespace ferry::client
