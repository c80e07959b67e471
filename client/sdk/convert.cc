#include "client/sdk/convert.h"

#include <string>

namespace ferry::sdk_convert {
namespace {

template <typename Repeated>
std::vector<std::string> Strings(const Repeated& values) {
  return std::vector<std::string>(values.begin(), values.end());
}

// google.rpc.Code and absl::StatusCode number the codes alike (absl/status/status.h); an
// unknown number from a newer agent reads as kUnknown rather than as a value out of range.
absl::StatusCode Code(int32_t code) {
  if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

Leg FromProto(const v1::Leg& leg) {
  Leg out;
  out.side = leg.side();
  out.mode = leg.mode();
  out.device = leg.device();
  out.nic = leg.nic();
  out.path = leg.path();
  out.provider = leg.provider();
  out.bytes = leg.bytes();
  out.duration = absl::Microseconds(leg.duration_us());
  out.reason = leg.reason();
  out.rails = Strings(leg.rails());
  return out;
}

OpResult FromProto(const v1::OpResult& op) {
  OpResult out;
  out.index = op.index();
  out.code = Code(op.code());
  out.message = op.message();
  out.bytes = op.bytes();
  out.provider = op.provider();
  out.duration = absl::Microseconds(op.duration_us());
  for (const v1::Leg& leg : op.legs()) out.legs.push_back(FromProto(leg));
  out.retries = Strings(op.retries());
  return out;
}

TransferState State(v1::TransferState state) {
  switch (state) {
    case v1::RUNNING:
      return TransferState::kRunning;
    case v1::SUCCEEDED:
      return TransferState::kSucceeded;
    case v1::FAILED:
      return TransferState::kFailed;
    default:
      return TransferState::kUnspecified;
  }
}

}  // namespace

BufferInfo FromProto(const v1::BufferInfo& info) {
  BufferInfo out;
  out.id = info.id();
  out.name = info.name();
  out.size = info.size();
  out.device = info.device();
  out.backend = info.backend();
  out.owner = info.owner();
  out.persist = info.persist();
  out.registered = info.registered();
  out.allowed_peers = Strings(info.allowed_peers());
  return out;
}

TransferResult FromProto(const v1::TransferResult& result) {
  TransferResult out;
  out.transfer_id = result.transfer_id();
  out.state = State(result.state());
  out.code = Code(result.code());
  out.message = result.message();
  out.bytes = result.bytes();
  out.bytes_total = result.bytes_total();
  out.duration = absl::Microseconds(result.duration_us());
  out.ops_total = result.ops_total();
  out.ops_succeeded = result.ops_succeeded();
  out.ops_failed = result.ops_failed();
  out.policy_generation = result.policy_generation();
  for (const v1::OpResult& op : result.ops()) out.ops.push_back(FromProto(op));
  return out;
}

PolicyState FromProto(const v1::PolicyState& policy) {
  PolicyState out;
  out.generation = policy.generation();
  out.gdr = policy.gdr();
  out.gdr_max_path = policy.gdr_max_path();
  out.fallback = policy.fallback();
  out.staging_chunk_bytes = policy.staging_chunk_bytes();
  out.staging_depth = policy.staging_depth();
  for (const v1::PolicySetting& s : policy.overrides()) {
    out.overrides.emplace_back(s.key(), s.value());
  }
  return out;
}

AgentInfo FromProto(const v1::GetInfoResponse& info) {
  AgentInfo out;
  out.node = info.node();
  out.version = info.version();
  out.pid = info.pid();
  out.providers = Strings(info.providers());
  out.peers = Strings(info.peers());
  out.buffer_count = info.buffer_count();
  out.host_pool_bytes = info.host_pool_bytes();
  out.host_pool_used_bytes = info.host_pool_used_bytes();
  out.registered_bytes = info.registered_bytes();
  out.transfers_active = info.transfers_active();
  out.transfers_done = info.transfers_done();
  out.sessions = info.sessions();
  out.policy_generation = info.policy_generation();
  return out;
}

Registration FromProto(const v1::RegisterMemoryResponse& response) {
  return Registration{FromProto(response.buffer()), response.existing()};
}

Notification FromProto(const v1::Notification& notification) {
  Notification out;
  out.name = notification.name();
  out.from_node = notification.from_node();
  out.bytes = notification.bytes();
  out.blocks = notification.blocks();
  out.sequence = notification.sequence();
  out.payload = notification.payload();
  return out;
}

std::vector<agent_client::OpSpec> ToOpSpecs(const std::vector<Op>& ops) {
  std::vector<agent_client::OpSpec> specs;
  specs.reserve(ops.size());
  for (const Op& op : ops) {
    agent_client::OpSpec spec;
    // Anything but the two named types reaches the agent as OP_TYPE_UNSPECIFIED, which it
    // refuses naming the op, as it would any client's.
    spec.type = op.type == OpType::kWrite  ? v1::WRITE
                : op.type == OpType::kRead ? v1::READ
                                           : v1::OP_TYPE_UNSPECIFIED;
    spec.local_buffer = op.local_buffer;
    spec.local_offset = op.local_offset;
    spec.peer = op.peer;
    spec.remote_buffer = op.remote_buffer;
    spec.remote_offset = op.remote_offset;
    spec.length = op.length;
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace ferry::sdk_convert
