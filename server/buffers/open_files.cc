#include "server/buffers/open_files.h"

#include <algorithm>
#include <fcntl.h>
#include <sys/resource.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

uint64_t SoftLimit() {
  rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : limit.rlim_cur;
}

// Descriptors kept for the agent's own sockets under a soft limit of `soft`: kReservedFds, or
// half of a limit too low for that (a test's 128, a container's), so that a client's
// buffer, which holds one descriptor, still fits.
uint64_t ReservedFds(uint64_t soft) { return std::min<uint64_t>(kReservedFds, soft / 2); }

}  // namespace

uint64_t RaiseOpenFileLimit() {
  rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("getrlimit(RLIMIT_NOFILE): {}", strerror(errno));
    return SoftLimit();
  }
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t was = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      spdlog::warn("setrlimit(RLIMIT_NOFILE, {}): {}; staying at {}", limit.rlim_max,
                   strerror(errno), was);
    }
  }
  const uint64_t now = SoftLimit();
  spdlog::info("open files: at most {} ({} kept for the agent's own sockets)", now,
               ReservedFds(now));
  return now;
}

absl::Status RoomForClientFd(uint64_t held, absl::string_view field) {
  const uint64_t soft = SoftLimit();
  const uint64_t reserved = ReservedFds(soft);
  if (held + 1 <= soft - reserved) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      field, ": the agent holds ", held, " client descriptors; its RLIMIT_NOFILE is ", soft,
      " and ", reserved,
      " are kept for its own sockets: deregister memory or free buffers first (or raise the "
      "agent's limit)"));
}

absl::StatusOr<UniqueFd> DupForClient(int fd, const std::string& what) {
  UniqueFd copy(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy.valid())
    return absl::ErrnoToStatus(errno, absl::StrCat("fcntl(F_DUPFD_CLOEXEC, ", what, ")"));
  return copy;
}

}  // namespace ferry::server
