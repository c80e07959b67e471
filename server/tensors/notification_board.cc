#include "server/tensors/notification_board.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

void NotificationBoard::Post(ferry::v1::Notification n) {
  absl::MutexLock lock(&mu_);
  uint64_t seq = next_sequence_++;
  n.set_sequence(seq);
  by_name_[n.name()].push_back(seq);
  by_sequence_.emplace(seq, std::move(n));
  while (by_sequence_.size() > capacity_) {
    const auto& oldest = by_sequence_.begin()->second;
    spdlog::warn("notification board full ({}): dropping '{}' from {}", capacity_, oldest.name(),
                 oldest.from_node());
    EraseLocked(by_sequence_.begin()->first);
  }
  posted_.SignalAll();
}

void NotificationBoard::EraseLocked(uint64_t sequence) {
  auto it = by_sequence_.find(sequence);
  if (it == by_sequence_.end()) return;
  auto names = by_name_.find(it->second.name());
  if (names != by_name_.end()) {
    auto& seqs = names->second;
    seqs.erase(std::remove(seqs.begin(), seqs.end(), sequence), seqs.end());
    if (seqs.empty()) by_name_.erase(names);
  }
  by_sequence_.erase(it);
}

std::optional<ferry::v1::Notification> NotificationBoard::TakeLocked(const std::string& name,
                                                                     const std::string& from_node) {
  auto names = by_name_.find(name);
  if (names == by_name_.end()) return std::nullopt;
  for (uint64_t seq : names->second) {
    const auto& n = by_sequence_.at(seq);
    if (!from_node.empty() && n.from_node() != from_node) continue;
    ferry::v1::Notification out = n;
    EraseLocked(seq);
    return out;
  }
  return std::nullopt;
}

absl::StatusOr<ferry::v1::Notification> NotificationBoard::Take(const std::string& name,
                                                                const std::string& from_node,
                                                                absl::Time deadline,
                                                                const CancelledFn& cancelled) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (auto n = TakeLocked(name, from_node)) return *std::move(n);
    absl::Time now = absl::Now();
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("wait for notification '", name, "' was cancelled"));
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no notification '", name, "'",
                       from_node.empty() ? "" : absl::StrCat(" from ", from_node),
                       " arrived before the deadline"));
    }
    posted_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(100)));
  }
}

std::optional<ferry::v1::Notification> NotificationBoard::TakePrefix(const std::string& prefix,
                                                                     absl::Time until) {
  absl::MutexLock lock(&mu_);
  while (true) {
    for (const auto& [seq, n] : by_sequence_) {
      if (absl::StartsWith(n.name(), prefix)) {
        ferry::v1::Notification out = n;
        EraseLocked(seq);
        return out;
      }
    }
    if (absl::Now() >= until) return std::nullopt;
    posted_.WaitWithDeadline(&mu_, until);
  }
}

size_t NotificationBoard::size() const {
  absl::MutexLock lock(&mu_);
  return by_sequence_.size();
}

}  // namespace ferry::server
