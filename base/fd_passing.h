#pragma once
// Descriptors over a Unix socket (SCM_RIGHTS): what the fd socket's two ends, the agent
// (server/local/fd_inbox) and the client (client/shared_memory), send and receive.

#include <sys/types.h>

#include <cstddef>
#include <vector>

#include "base/unique_fd.h"

namespace ferry {

// sendmsg of `n` bytes of `data` on `sock` with descriptor `fd` attached (none when fd < 0).
// sendmsg's result: the bytes sent, or -1 with errno.
ssize_t SendWithFd(int sock, const void* data, size_t n, int fd, int flags);

// One recvmsg of up to `n` bytes into `data`, `flags` | MSG_CMSG_CLOEXEC (a descriptor
// received is never inherited by a child). Every descriptor that came with them is appended
// to `fds`, owned, so that a malformed message leaks none; up to four fit, and `truncated`
// (when given) says the kernel dropped more (MSG_CTRUNC). recvmsg's result.
ssize_t RecvWithFds(int sock, void* data, size_t n, int flags, std::vector<UniqueFd>* fds,
                    bool* truncated = nullptr);

}  // namespace ferry
