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
#include "ferry/v1/peer.grpc.pb.h"
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

// The checks use channels of their own, with a subchannel pool of their own: a check that
// finds a peer down must not put the directory's channel (the one transfers use) into its
// reconnect back-off, or a peer that starts after us would be refused for a while.
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

  // The check's own stub to `node`'s current address (made or remade as it changes).
  absl::StatusOr<ferry::v1::Peer::Stub*> StubFor(const std::string& node,
                                                 const std::string& address);

  PeerDirectory* const peers_;
  const absl::Duration interval_;
  struct Channel {
    std::string address;
    std::unique_ptr<ferry::v1::Peer::Stub> stub;
  };
  std::map<std::string, Channel> channels_;  // the check thread's own
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, PeerCheck> checks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ferry::server
