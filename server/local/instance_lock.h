#pragma once
// One agent per local socket. The agent holds an flock on SOCKET.lock (with its pid in
// it) for its whole life, so a second agent with the same config refuses to start instead
// of taking the socket over, and removes the socket at exit only if it is still the one
// it bound (a successor may already have bound its own).

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"

namespace ferry::server {

class InstanceLock {
 public:
  // Takes the lock beside `socket_path`. Held by a running agent whose socket answers:
  // FAILED_PRECONDITION naming that agent's pid, at once. Held by one whose socket does
  // not answer (it is stopping): waits up to `wait` for it to let go, so stop-then-start
  // works without a sleep. Once taken, removes a stale socket a crashed agent left.
  static absl::StatusOr<std::unique_ptr<InstanceLock>> Acquire(const std::string& socket_path,
                                                               absl::Duration wait);
  // Removes the socket if it is still ours, then lets go of the lock.
  ~InstanceLock();

  // Call after the socket is bound: remembers it, so that only this one is ever removed.
  void NoteSocketBound();
  // Removes the socket now if it is still the one we bound (at the start of shutdown, so
  // a successor stops seeing a live agent there). Idempotent.
  void RemoveSocket();

 private:
  InstanceLock(std::string socket_path, std::string lock_path, UniqueFd fd)
      : socket_path_(std::move(socket_path)),
        lock_path_(std::move(lock_path)),
        fd_(std::move(fd)) {}

  const std::string socket_path_;
  const std::string lock_path_;
  UniqueFd fd_;
  dev_t socket_dev_ = 0;
  ino_t socket_ino_ = 0;  // 0: not bound yet, or removed
};

}  // namespace ferry::server
