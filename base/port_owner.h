#pragma once
// Which process listens on a TCP port, read from /proc (net/tcp{,6} for the socket's inode,
// then each process's fds): for "the port is in use by pid N" messages. Best effort: a
// process of another user may be invisible, and then the answer is 0.

#include <sys/types.h>

#include <cstdint>

namespace ferry {

// The pid of a process with a socket listening on `port` (any address), or 0 if none found.
pid_t ListeningPortOwner(uint16_t port);

}  // namespace ferry
