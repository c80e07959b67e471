#pragma once
// Notifications that batches of blocks landed in this node's buffers ("req-42/layer-7"),
// posted by the sending agents after every block of a batch completed, and taken by local
// clients. A notification waits on the board until someone takes it, so waiting after it
// arrived works as well as waiting before. Each is delivered once.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/tensor.pb.h"
#include "server/tensors/recv_matcher.h"

namespace ferry::server {

class NotificationBoard {
 public:
  // At most `capacity` untaken notifications; beyond it the oldest is dropped (and logged),
  // so a client that never waits cannot grow the agent without bound.
  explicit NotificationBoard(size_t capacity = 65536) : capacity_(capacity) {}

  // Assigns the sequence number and wakes waiters.
  void Post(ferry::v1::Notification n);
  // Takes the oldest notification named `name` (and from `from_node`, if not empty).
  // DEADLINE_EXCEEDED at `deadline`, CANCELLED when `cancelled()`. A notification that
  // reports a failed batch is returned as is; the caller turns it into an error.
  absl::StatusOr<ferry::v1::Notification> Take(const std::string& name,
                                               const std::string& from_node, absl::Time deadline,
                                               const CancelledFn& cancelled);
  // Takes the oldest notification whose name starts with `prefix`, waiting until `until`.
  std::optional<ferry::v1::Notification> TakePrefix(const std::string& prefix, absl::Time until);

  size_t size() const;

 private:
  std::optional<ferry::v1::Notification> TakeLocked(const std::string& name,
                                                    const std::string& from_node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(uint64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::CondVar posted_;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  // In arrival order, and by name for O(1) waits on one name among thousands.
  std::map<uint64_t, ferry::v1::Notification> by_sequence_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::deque<uint64_t>> by_name_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
