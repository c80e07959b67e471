#pragma once
// A transfer whose peer is this node itself is a local access and is checked as one. The
// Peer API that answers it sees only this node as the caller (its own certificate), so an
// unscoped export would be open to every local uid through the node's own name; "exported"
// means to other agents, authenticated by mTLS. A local caller reaches a buffer of this node
// by name only when it may use it (LocalCallers::MayUse: its owner, root, the admin group).

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "server/buffers/buffer_registry.h"
#include "server/local/local_callers.h"

namespace ferry::server {

// OK unless `name` names a buffer of this node that `caller` may not use: then
// PERMISSION_DENIED naming `field`. An unknown name passes (resolving it refuses it, with
// the message a peer would give).
absl::Status MayReachOwnNodeBuffer(const LocalCallers& callers,
                                   const std::optional<LocalCaller>& caller,
                                   const BufferRegistry& buffers, const std::string& name,
                                   const std::string& field);

}  // namespace ferry::server
