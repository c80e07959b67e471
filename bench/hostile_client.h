#pragma once
// A hostile local client for ferry-soak --hostile (issue 44): every trick a buggy or
// malicious tenant tried on a shared node, looping until SIGTERM, as another uid when
// started as root. Its own failures are expected and not counted; what it must not do is
// disturb the other clients, which the soak measures.
//
//   shrink  registers a memfd it can shrink (no MFD_ALLOW_SEALING), starts a 1 MiB WRITE from
//           it and truncates it meanwhile
//   flood   notifications to its own buffer on the peer, never taken
//   hoard   4 KiB WRITEs submitted and never waited for, as many as it is let
//   frames  transfer-socket connections holding most of a 64 MiB frame, never finished
//   burn    no trick: a control that only spins, $FERRY_HOSTILE_BURN of one core (0.5
//           default), to tell what the hostile client's CPU alone costs the others on a
//           machine of few cores from what its tricks cost them through the agent

#include <sys/types.h>

#include <string>

namespace ferry::soak {

// Runs the hostile client against node-a's socket `socket_a` and node-b's `socket_b`
// (moving to node-b), as `uid` when it differs from ours (root only). Returns when SIGTERM
// comes (its exit code).
int RunHostileClient(const std::string& socket_a, const std::string& socket_b, uid_t uid);

}  // namespace ferry::soak
