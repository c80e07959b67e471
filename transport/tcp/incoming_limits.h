#pragma once
// Caps on the tcp data listener's incoming connections, in total and per source address,
// so that one client (or a flood of idle connections) cannot take every fd and thread of
// the agent. Thread-safe.

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
  // when either cap is reached.
  bool Admit(const std::string& source);
  // Gives back a slot Admit took.
  void Release(const std::string& source);
  uint32_t total() const;

 private:
  const uint32_t max_total_;
  const uint32_t max_per_source_;
  mutable absl::Mutex mu_;
  uint32_t total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint32_t> by_source_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::tcp
