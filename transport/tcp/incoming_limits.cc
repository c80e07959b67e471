#include "transport/tcp/incoming_limits.h"

namespace ferry::tcp {

bool IncomingLimits::Admit(const std::string& source) {
  absl::MutexLock lock(&mu_);
  uint32_t& from_source = by_source_[source];
  if (total_ >= max_total_ || from_source >= max_per_source_) {
    if (from_source == 0) by_source_.erase(source);
    return false;
  }
  ++from_source;
  ++total_;
  return true;
}

void IncomingLimits::Release(const std::string& source) {
  absl::MutexLock lock(&mu_);
  auto it = by_source_.find(source);
  if (it == by_source_.end()) return;
  if (--it->second == 0) by_source_.erase(it);
  --total_;
}

uint32_t IncomingLimits::total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace ferry::tcp
