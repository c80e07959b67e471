#pragma once
// Who may make each local call: the one table every service consults (docs/operator-guide.md
// "Local callers: who may do what" lists the same rows; tests/call_rules_test.cc checks that
// every Agent and Tensors RPC has a row and that the guide agrees). The kernel names the
// caller (SO_PEERCRED, server/local/local_callers.h); a caller over local_tcp is
// authenticated by its TLS certificate instead and treated as an operator (no uid to
// compare).
//
// Three rules:
//   kAnyone   - reads of node-wide facts (info, topology, policy, peers, totals) and calls
//               that make something the caller then owns (alloc, register, a session).
//   kOwner    - acts on data or handles that belong to a uid (buffers, registrations, block
//               lists, transfers, pending sends and receives, notifications): the owner,
//               root or the admin group (security.admin_group). Listings show the caller's
//               own rows only, all of them to root and the admin group.
//   kOperator - changes the node for everyone (policy, NIC state, peers): root or the admin
//               group only.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ferry::server {

enum class CallRule { kAnyone, kOwner, kOperator };

struct CallRuleRow {
  const char* call;  // "Agent.SetPolicy", "Tensors.MoveBlocks", "TransferSocket.Move"
  CallRule rule;
  const char* what;  // one line for the operator guide's table
};

absl::Span<const CallRuleRow> CallRules();
// The row for `call`, or null.
const CallRuleRow* FindCallRule(absl::string_view call);
// "anyone", "owner", "operator".
absl::string_view CallRuleName(CallRule rule);

}  // namespace ferry::server
