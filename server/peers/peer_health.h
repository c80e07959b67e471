#pragma once
// How each peer is doing, checked in the background: every `interval` a Health call to each
// peer in the directory, with its round-trip time, the incarnation it answered and the last
// error, so that `ferryctl peers` (ListPeers) and the metrics show a killed peer as
// unhealthy within a couple of intervals, without waiting for a transfer to fail.

#include <cstdint>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

struct PeerCheck {
  bool checked = false;  // at least one Health call finished
  bool healthy = false;  // the last one answered
  absl::Duration rtt;    // of the last answer
  uint64_t incarnation = 0;
  std::string last_error;
  absl::Time last_ok = absl::InfinitePast();
  absl::Time checked_at = absl::InfinitePast();
};

class PeerHealth {
 public:
  // Starts checking `peers` (which must outlive this) every `interval`, each call bounded by
  // `interval` too.
  PeerHealth(PeerDirectory* peers, absl::Duration interval = absl::Seconds(1));
  // Stops the thread (at most one call's deadline later).
  ~PeerHealth();

  // The last check of every peer the directory knows now ("unchecked" ones too).
  std::map<std::string, PeerCheck> Snapshot() const;

 private:
  void Run();
  void CheckOne(const std::string& node);

  PeerDirectory* const peers_;
  const absl::Duration interval_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, PeerCheck> checks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ferry::server
