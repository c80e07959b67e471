#pragma once
// The agent's file descriptors. Every registration of a client's file holds one, and so do
// the listeners, the peers' connections and the clients' sockets: the soft RLIMIT_NOFILE
// (1024 under most shells and systemd's default) is raised to the hard limit at start, and
// registrations stop kReservedFds short of it, so that a client holding thousands cannot
// leave the Peer API unable to accept (once it could not complete a TLS handshake again
// after EMFILE).

#include <cstdint>

#include "absl/status/status.h"

namespace ferry::server {

inline constexpr uint64_t kReservedFds = 1024;

// Raises the soft limit to the hard one; returns the soft limit in force after.
uint64_t RaiseOpenFileLimit();

// OK while one more client descriptor, beside the `held` ones registrations hold now,
// leaves kReservedFds of the soft limit free; RESOURCE_EXHAUSTED naming the numbers else.
absl::Status RoomForClientFd(uint64_t held);

}  // namespace ferry::server
