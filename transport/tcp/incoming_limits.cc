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

bool IncomingLimits::Authenticate(const std::string& source, const std::string& node) {
  absl::MutexLock lock(&mu_);
  auto of_node = by_node_.find(node);
  if (of_node != by_node_.end() && of_node->second >= max_per_source_) return false;
  auto from = by_source_.find(source);
  if (from != by_source_.end() && --from->second == 0) by_source_.erase(from);
  ++by_node_[node];
  return true;
}

void IncomingLimits::Release(const std::string& source, const std::string& node) {
  absl::MutexLock lock(&mu_);
  auto& counts = node.empty() ? by_source_ : by_node_;
  auto it = counts.find(node.empty() ? source : node);
  if (it == counts.end()) return;
  if (--it->second == 0) counts.erase(it);
  --total_;
}

uint32_t IncomingLimits::total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace ferry::tcp
