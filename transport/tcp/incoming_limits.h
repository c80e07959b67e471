#pragma once
// Caps on the tcp data listener's incoming connections: in total, per source address while
// a connection has not said its hello (a flood of idle or unauthenticated connections from
// one address), and per peer node once its hello admitted it. Counting admitted connections
// by node, not address, lets many agents behind one address (containers on a host, a test's
// 16 agents on 127.0.0.1) each have their share. Thread-safe.

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace ferry::tcp {

class IncomingLimits {
 public:
  IncomingLimits(uint32_t max_total, uint32_t max_per_source)
      : max_total_(max_total), max_per_source_(max_per_source) {}

  // Takes a slot for a connection from `source` (its IP address); false, taking nothing,
  // when the total or the source's cap is reached.
  bool Admit(const std::string& source);
  // The connection from `source` was admitted for peer `node` (its hello): its slot moves
  // from the source to the node. False when the node has max_per_source already: the slot
  // stays the source's (Release gives it back), and the caller refuses the connection.
  bool Authenticate(const std::string& source, const std::string& node);
  // Gives back a slot: the node's for an authenticated connection (`node` not empty), else
  // the source's.
  void Release(const std::string& source, const std::string& node = "");
  uint32_t total() const;
  uint32_t max_per_peer() const { return max_per_source_; }

 private:
  const uint32_t max_total_;
  const uint32_t max_per_source_;
  mutable absl::Mutex mu_;
  uint32_t total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint32_t> by_source_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> by_node_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::tcp
