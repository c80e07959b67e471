#pragma once
// Notifications that go out after a transfer finished (MoveBlocks' notification): queued by
// the engine's completion hook, which must not block, and delivered to the peer's agent by
// one thread of their own, in order. A peer that cannot be told within kNotifyTimeout is
// logged; the notification is not retried (its waiter times out, as for a lost peer).

#include <deque>
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

  // `peers` (its channels, and this node's name) must outlive Stop().
  explicit NotifySender(PeerDirectory* peers) : peers_(peers) {}
  ~NotifySender() { Stop(); }

  // Queues `n` for `node`'s agent; dropped after Stop.
  void Send(const std::string& node, ferry::v1::Notification n);
  // Delivers what is queued (each within kNotifyTimeout), then stops the thread.
  void Stop();
  // Queued and not yet delivered (tests; returns to 0).
  size_t pending() const;

 private:
  void Run();

  PeerDirectory* const peers_;
  mutable absl::Mutex mu_;
  std::deque<std::pair<std::string, ferry::v1::Notification>> queue_ ABSL_GUARDED_BY(mu_);
  size_t sending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // started on first use
};

}  // namespace ferry::server
