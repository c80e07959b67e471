#pragma once
// AddPeer / RemovePeer: peers an operator adds at run time (`ferryctl peers add`), checked as
// the config file's are, kept across SIGHUP reloads (PeerSource::kRuntime).

#include "absl/status/statusor.h"
#include "ferry/v1/agent.pb.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

// INVALID_ARGUMENT naming the field for a bad node name or address, or this node itself.
absl::StatusOr<ferry::v1::PeerChange> AddRuntimePeer(PeerDirectory& peers,
                                                     const ferry::v1::AddPeerRequest& req);

// NOT_FOUND for no such peer; FAILED_PRECONDITION for a peer only the config file or etcd
// names (saying what to do instead).
absl::StatusOr<ferry::v1::PeerChange> RemoveRuntimePeer(PeerDirectory& peers,
                                                        const ferry::v1::RemovePeerRequest& req);

}  // namespace ferry::server
