#pragma once
// The Agent service's messages as libferry's public values (<ferry/types.h>), and back. Not
// in ferry::sdk: libferry.map exports that namespace, and these are no part of the API.

#include <vector>

#include "client/sdk/agent_client.h"
#include "ferry/types.h"
#include "ferry/v1/agent.pb.h"
#include "ferry/v1/tensor.pb.h"

namespace ferry::sdk_convert {

BufferInfo FromProto(const v1::BufferInfo& info);
TransferResult FromProto(const v1::TransferResult& result);
PolicyState FromProto(const v1::PolicyState& policy);
AgentInfo FromProto(const v1::GetInfoResponse& info);
Registration FromProto(const v1::RegisterMemoryResponse& response);
Notification FromProto(const v1::Notification& notification);
std::vector<agent_client::OpSpec> ToOpSpecs(const std::vector<Op>& ops);

}  // namespace ferry::sdk_convert
