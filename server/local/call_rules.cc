#include "server/local/call_rules.h"

namespace ferry::server {
namespace {

constexpr CallRule kAnyone = CallRule::kAnyone;
constexpr CallRule kOwner = CallRule::kOwner;
constexpr CallRule kOperator = CallRule::kOperator;

// Keep in the services' order (proto/ferry/v1/agent.proto, tensor.proto).
constexpr CallRuleRow kRules[] = {
    {"Agent.OpenSession", kAnyone, "a session of the caller's uid"},
    {"Agent.GetInfo", kAnyone, "node-wide counts"},
    {"Agent.SetNicState", kOperator, "takes a rail out of service for every client"},
    {"Agent.ListPeers", kAnyone, "the node's peers"},
    {"Agent.ListTransfers", kOwner, "the caller's transfers"},
    {"Agent.GetStats", kAnyone, "node-wide totals"},
    {"Agent.AllocBuffer", kAnyone, "a buffer the caller then owns (limits.per_uid_buffers)"},
    {"Agent.FreeBuffer", kOwner, "the buffer's owner"},
    {"Agent.ListBuffers", kOwner, "the caller's buffers"},
    {"Agent.StatRemoteBuffer", kOwner, "another node's export; on this node, the owner's"},
    {"Agent.Submit", kOwner, "local buffers the caller owns; on this node, remote ones too"},
    {"Agent.Wait", kOwner, "the transfer's submitter"},
    {"Agent.Transfer", kOwner, "as Submit"},
    {"Agent.TransferStream", kOwner, "as Submit"},
    {"Agent.Cancel", kOwner, "the transfer's submitter"},
    {"Agent.Watch", kOwner, "the transfer's submitter"},
    {"Agent.GetTopology", kAnyone, "the node's topology"},
    {"Agent.GetPolicy", kAnyone, "the policy in force"},
    {"Agent.SetPolicy", kOperator, "changes every client's transfers"},
    {"Agent.AddPeer", kOperator, "where every client's transfers to that node go"},
    {"Agent.RemovePeer", kOperator, "as AddPeer"},
    {"Agent.RegisterMemory", kAnyone, "memory the caller passed (limits.per_uid_registrations)"},
    {"Agent.DeregisterMemory", kOwner, "the registration's owner"},
    {"Tensors.Send", kOwner, "a buffer the caller owns"},
    {"Tensors.Recv", kOwner, "a landing buffer the caller owns"},
    {"Tensors.WriteBlocks", kOwner, "a buffer the caller owns"},
    {"Tensors.WaitNotification", kOwner, "notifications for the caller's buffers and lists"},
    {"Tensors.StreamNotifications", kOwner, "as WaitNotification"},
    {"Tensors.PollNotifications", kOwner, "as WaitNotification"},
    {"Tensors.Cancel", kOwner, "the caller's own sends and receives"},
    {"Tensors.ListPending", kOwner, "the caller's own sends and receives"},
    {"Tensors.PrepareBlocks", kOwner, "buffers the caller owns, in its session"},
    {"Tensors.ReleaseBlocks", kOwner, "a list of the caller's session"},
    {"Tensors.MoveBlocks", kOwner, "a list of the caller's session; on this node, both"},
    {"Tensors.Notify", kOwner, "in the caller's session; on this node, a list it may use"},
    {"TransferSocket.Transfer", kOwner, "as Agent.Submit"},
    {"TransferSocket.Move", kOwner, "as Tensors.MoveBlocks"},
    {"FdSocket.Pass", kAnyone,
     "a descriptor for the caller's own RegisterMemory (a ticket only its uid can use)"},
    {"FdSocket.Lend", kOwner, "the file of a buffer the caller owns, to map it"},
};

}  // namespace

absl::Span<const CallRuleRow> CallRules() { return kRules; }

const CallRuleRow* FindCallRule(absl::string_view call) {
  for (const CallRuleRow& row : kRules) {
    if (call == row.call) return &row;
  }
  return nullptr;
}

absl::string_view CallRuleName(CallRule rule) {
  switch (rule) {
    case CallRule::kAnyone:
      return "anyone";
    case CallRule::kOwner:
      return "owner";
    case CallRule::kOperator:
      return "operator";
  }
  return "?";
}

}  // namespace ferry::server
