#pragma once
// Notifications that go out after a transfer finished (MoveBlocks' notification): queued by
// the engine's completion hook, which must not block, and delivered to each peer's agent by
// a thread of that peer's own, in order, so that a peer that does not answer holds up only
// its own. A notification not delivered within kNotifyTimeout is logged and not retried (its
// waiter times out, as for a lost peer); a peer's queue holds at most kMaxQueued.

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/tensor.pb.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

class NotifySender {
 public:
  static constexpr absl::Duration kNotifyTimeout = absl::Seconds(5);
  static constexpr size_t kMaxQueued = 65536;
  // What Stop gives the queues, all together, before it drops what is left.
  static constexpr absl::Duration kStopBudget = absl::Seconds(5);

  // `peers` (its channels, and this node's name) must outlive Stop().
  explicit NotifySender(PeerDirectory* peers) : peers_(peers) {}
  ~NotifySender() { Stop(); }

  // Queues `n` for `node`'s agent; dropped after Stop, or (logged) when the queue is full.
  void Send(const std::string& node, ferry::v1::Notification n);
  // Delivers what is queued within kStopBudget, drops the rest, and stops the threads.
  void Stop();
  // Queued and not yet delivered (tests; returns to 0).
  size_t pending() const;

 private:
  struct Lane {
    std::deque<ferry::v1::Notification> queue;
    size_t sending = 0;
    std::thread thread;
  };
  void Run(const std::string& node, Lane* lane);

  PeerDirectory* const peers_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);  // by peer
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time stop_by_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace ferry::server
