#pragma once
// Finding how this process's memory is shared, so that it can be registered with the agent
// (RegisterMemory): the file behind a mapping (memfd, POSIX shm, a file mapped MAP_SHARED)
// and a descriptor for it, and passing that descriptor to the agent's fd socket; and
// borrowing the file of a buffer the agent allocated for us, to map it.
//
// Memory from malloc, a plain numpy array or a MAP_PRIVATE mapping has no file the agent
// could map too: FindSharedFile refuses it, saying how to allocate shareable memory instead.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace ferry {

struct SharedFile {
  UniqueFd fd;          // open O_RDWR on the file
  uint64_t offset = 0;  // of the address in the file
};

// The file behind [address, address + length) of this process, which must lie in one
// shared file mapping (/proc/self/maps). The descriptor is one this process holds for the
// file (a memfd, an unlinked shm file: /proc/self/fd) or, for a file that still has a
// path, a new one. FAILED_PRECONDITION naming `field` for private memory, with what to do.
absl::StatusOr<SharedFile> FindSharedFile(const void* address, uint64_t length,
                                          const std::string& field = "memory");

// Passes `fd` to the agent's fd socket at `fd_socket` (server/local/fd_inbox.h) and returns
// its ticket for RegisterMemory. UNAVAILABLE when the socket cannot be reached or refuses.
absl::StatusOr<uint64_t> PassFd(const std::string& fd_socket, int fd);

// The file of agent buffer `buffer`, lent by the agent's fd socket (its lend request,
// server/local/fd_inbox.h) to the buffer's owner uid: what this process maps at the
// buffer's ShmMapping offset. The agent's code and message when it refuses
// (PERMISSION_DENIED for another uid's buffer); UNAVAILABLE when the socket cannot be
// reached.
absl::StatusOr<UniqueFd> BorrowBufferFile(const std::string& fd_socket, uint64_t buffer);

}  // namespace ferry
