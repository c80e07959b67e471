#pragma once
// Which buffer files the fd socket lends, and to whom (FdInbox's lend request,
// server/local/fd_inbox.h; the "FdSocket.Lend" row of server/local/call_rules.h): a buffer's
// own file, to its owner uid, root or the admin group. A non-root client of a root agent
// maps what it allocated this way; /proc/<agent pid>/fd/N would refuse it.

#include <sys/socket.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "server/buffers/buffer_registry.h"
#include "server/local/local_callers.h"

namespace ferry::server {

// A descriptor for buffer `id`'s file, for `caller` (the fd socket connection's
// SO_PEERCRED). PERMISSION_DENIED naming both uids when it is another uid's buffer,
// NOT_FOUND for an unknown id, FAILED_PRECONDITION for memory that is no host file (GPU).
absl::StatusOr<UniqueFd> LendBufferFile(const LocalCallers& callers, const BufferRegistry& buffers,
                                        uint64_t id, const ucred& caller);

}  // namespace ferry::server
