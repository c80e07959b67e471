#pragma once
// The agent's file descriptors. Every registration of a client's file holds one, and so do
// the listeners, the peers' connections and the clients' sockets: the soft RLIMIT_NOFILE
// (1024 under most shells and systemd's default) is raised to the hard limit at start, and
// registrations stop kReservedFds short of it (half of a limit below twice that), so that a client
// holding thousands cannot leave the Peer API unable to accept (once it could not complete a TLS
// handshake again after EMFILE).

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"

namespace ferry::server {

inline constexpr uint64_t kReservedFds = 1024;

// Raises the soft limit to the hard one; returns the soft limit in force after.
uint64_t RaiseOpenFileLimit();

// OK while one more client descriptor, beside the `held` ones registrations hold now,
// leaves kReservedFds of the soft limit free; RESOURCE_EXHAUSTED naming the numbers and
// `field` (the request field the client can change) else.
absl::Status RoomForClientFd(uint64_t held, absl::string_view field = "fd_ticket");

// One descriptor held for a client's memory while this lives: a registration's file, or a
// host pool buffer's own file (transport/memory/host_pool.h). held() counts them all, for
// RoomForClientFd.
class ClientFdHold {
 public:
  ClientFdHold() { held_.fetch_add(1, std::memory_order_relaxed); }
  ~ClientFdHold() { held_.fetch_sub(1, std::memory_order_relaxed); }
  ClientFdHold(const ClientFdHold&) = delete;
  ClientFdHold& operator=(const ClientFdHold&) = delete;
  static uint64_t held() { return held_.load(std::memory_order_relaxed); }

 private:
  static inline std::atomic<uint64_t> held_{0};
};

// A second descriptor for `fd`'s file, close-on-exec (fcntl F_DUPFD_CLOEXEC), to lend a
// client; the errno of the call naming `what` when the agent is out of descriptors.
absl::StatusOr<UniqueFd> DupForClient(int fd, const std::string& what);

}  // namespace ferry::server
