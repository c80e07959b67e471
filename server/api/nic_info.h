#pragma once
// The agent's fabrics as the Agent API shows them (GetInfo.nics, `ferryctl nics`): one
// NicInfo per rail with its health, the memory it carries, what peers moved through it and
// what the engine's ledger says it carried to each peer.

#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/agent.pb.h"

namespace ferry::server {

class AgentCore;

// Every fabric of `core`, in preference order.
void DescribeNics(AgentCore& core, ferry::v1::GetInfoResponse* info);

// Suspends (up = false, with `reason`) or resumes every fabric whose rail ("tcp:mlx5_0") or
// NIC ("mlx5_0") is `nic`, and describes them after the change. NOT_FOUND naming the rails
// there are for a name that matches none.
absl::StatusOr<ferry::v1::SetNicStateResponse> SetNicState(
    AgentCore& core, const ferry::v1::SetNicStateRequest& req);

}  // namespace ferry::server
