#pragma once
// A listening Unix socket with the mode and group config asks for, set before anyone can
// connect: the local API's socket and the fd socket beside it (fd_inbox.h).

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace ferry::server {

// Binds and listens on `path` (a stale socket file there is replaced: the instance lock is
// held), gives it `mode` and, unless -1, `group`. Non-blocking. Errors name the call, the
// path and errno; `key` names the config key for a path too long.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode, gid_t group,
                                    const std::string& key);

}  // namespace ferry::server
