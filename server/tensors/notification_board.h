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

// INVALID_ARGUMENT naming `field` for a payload over NotificationBoard::kMaxPayloadBytes,
// or one without a notification to carry it (`notification` empty).
absl::Status CheckNotificationPayload(const std::string& payload, const std::string& notification,
                                      const std::string& field);

class NotificationBoard {
 public:
  // Who a notification is for: the uid owning the list or buffer its batch landed in
  // (kAnyone when that is not known: the target went, or an older peer did not name it).
  // A taker gets its own uid's and kAnyone's; a taker of kAnyone (a caller over local_tcp,
  // authenticated by TLS) gets every one.
  static constexpr int64_t kAnyone = -1;
  // What a notification may carry beside its name (MoveBlocks' notification_payload): enough
  // for a connector's request id and block ids, small enough that a full board stays small.
  static constexpr size_t kMaxPayloadBytes = 4096;
  // What one Poll answers at most (more wait for the next): far under gRPC's 4 MiB default
  // message limit and the transfer socket's frame limit.
  static constexpr size_t kMaxPollBytes = 1 << 20;

  // At most `capacity` untaken notifications per receiver, a receiver being a uid and the
  // node the notifications came from, and at most `payload_capacity` bytes of their
  // payloads (65536 full 4 KiB payloads would be 256 MiB); beyond either that receiver's
  // oldest is dropped (and logged), so a client that never waits cannot grow the agent
  // without bound, and a flood from one node to one uid never drops another receiver's.
  explicit NotificationBoard(size_t capacity = 65536, size_t payload_capacity = 16 << 20)
      : capacity_(capacity), payload_capacity_(payload_capacity) {}

  // Assigns the sequence number and wakes waiters.
  void Post(ferry::v1::Notification n, int64_t owner = kAnyone);
  // Takes the oldest notification named `name` (and from `from_node`, if not empty) that
  // `taker` may have. DEADLINE_EXCEEDED at `deadline` (absl::InfinitePast(): a poll, which
  // looks once), CANCELLED when `cancelled()`. A
  // notification that reports a failed batch is returned as is; the caller turns it into
  // an error.
  absl::StatusOr<ferry::v1::Notification> Take(const std::string& name,
                                               const std::string& from_node, int64_t taker,
                                               absl::Time deadline,
                                               const CancelledFn& cancelled);
  // Takes the oldest notification whose name starts with `prefix` that `taker` may have,
  // waiting until `until`.
  std::optional<ferry::v1::Notification> TakePrefix(const std::string& prefix, int64_t taker,
                                                    absl::Time until);
  // Takes, without waiting, every notification whose name starts with `prefix` that `taker`
  // may have, oldest first: at most `max_count` (0: no limit) and about kMaxPollBytes (at
  // least one); `more` says others were left. Each is taken once, by this or another taker.
  ferry::v1::PollNotificationsResponse Poll(const std::string& prefix, uint32_t max_count,
                                            int64_t taker);

  size_t size() const;
  // Untaken notifications `taker` may have.
  size_t size_for(int64_t taker) const;

 private:
  struct Entry {
    ferry::v1::Notification note;
    int64_t owner = kAnyone;
  };
  using Receiver = std::pair<int64_t, std::string>;  // (owner, from_node)

  static bool MayTake(const Entry& e, int64_t taker) {
    return taker == kAnyone || e.owner == kAnyone || e.owner == taker;
  }
  std::optional<ferry::v1::Notification> TakeLocked(const std::string& name,
                                                    const std::string& from_node, int64_t taker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(uint64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `receiver`'s oldest notifications while it holds more than capacity_ of them or
  // more than payload_capacity_ bytes of payloads.
  void TrimLocked(const Receiver& receiver) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const size_t payload_capacity_;
  mutable absl::Mutex mu_;
  absl::CondVar posted_;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  // In arrival order, and by name for O(1) waits on one name among thousands.
  std::map<uint64_t, Entry> by_sequence_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::deque<uint64_t>> by_name_ ABSL_GUARDED_BY(mu_);
  // Each receiver's notifications in arrival order: live ones and, until trimmed, the
  // sequence numbers of ones taken since (no longer in by_sequence_); and how many are live.
  struct Queue {
    std::deque<uint64_t> sequences;
    size_t live = 0;
    size_t payload_bytes = 0;  // of the live ones
  };
  absl::flat_hash_map<Receiver, Queue> by_receiver_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
