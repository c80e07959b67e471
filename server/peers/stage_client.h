#pragma once
// The gRPC side of StageCall: one Peer.Stage bidirectional stream to the peer's agent, with
// a reader thread that turns its replies into grants, copy reports and the verdict.

#include "server/peers/peer_directory.h"
#include "server/peers/stage_call.h"

namespace ferry::server {

// Stage calls over the Peer stubs of `peers` (which outlives every call it makes).
StageCallFactory GrpcStageCalls(PeerDirectory* peers);

}  // namespace ferry::server
