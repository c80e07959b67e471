#include "server/tensors/notification_board.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

absl::Status CheckNotificationPayload(const std::string& payload, const std::string& notification,
                                      const std::string& field) {
  if (payload.size() > NotificationBoard::kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", payload.size(),
                                                   " bytes is more than ",
                                                   NotificationBoard::kMaxPayloadBytes));
  }
  if (!payload.empty() && notification.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": a payload travels with a notification; name one"));
  }
  return absl::OkStatus();
}

void NotificationBoard::Post(ferry::v1::Notification n, int64_t owner) {
  absl::MutexLock lock(&mu_);
  uint64_t seq = next_sequence_++;
  n.set_sequence(seq);
  by_name_[n.name()].push_back(seq);
  Receiver receiver{owner, n.from_node()};
  Queue& queue = by_receiver_[receiver];
  queue.sequences.push_back(seq);
  ++queue.live;
  queue.payload_bytes += n.payload().size();
  by_sequence_.emplace(seq, Entry{std::move(n), owner});
  TrimLocked(receiver);
  posted_.SignalAll();
}

void NotificationBoard::TrimLocked(const Receiver& receiver) {
  auto it = by_receiver_.find(receiver);
  if (it == by_receiver_.end()) return;
  Queue& queue = it->second;
  while ((queue.live > capacity_ || queue.payload_bytes > payload_capacity_) &&
         !queue.sequences.empty()) {
    const uint64_t oldest = queue.sequences.front();
    queue.sequences.pop_front();
    auto entry = by_sequence_.find(oldest);
    if (entry == by_sequence_.end()) continue;  // taken already
    spdlog::warn(
        "notification board: {} untaken notifications ({} payload bytes) from {} for uid {}: "
        "dropping '{}'",
        queue.live, queue.payload_bytes, receiver.second, receiver.first,
        entry->second.note.name());
    const bool last = queue.live == 1;
    EraseLocked(oldest);
    if (last) return;  // EraseLocked dropped the queue with its last live one
  }
  // Taken ones leave their numbers behind: dropped once they outnumber the live ones.
  if (queue.sequences.size() > 2 * queue.live + 64) {
    std::deque<uint64_t> live;
    for (uint64_t seq : queue.sequences) {
      if (by_sequence_.contains(seq)) live.push_back(seq);
    }
    queue.sequences = std::move(live);
  }
}

void NotificationBoard::EraseLocked(uint64_t sequence) {
  auto it = by_sequence_.find(sequence);
  if (it == by_sequence_.end()) return;
  const ferry::v1::Notification& note = it->second.note;
  auto names = by_name_.find(note.name());
  if (names != by_name_.end()) {
    auto& seqs = names->second;
    seqs.erase(std::remove(seqs.begin(), seqs.end(), sequence), seqs.end());
    if (seqs.empty()) by_name_.erase(names);
  }
  auto receiver = by_receiver_.find(Receiver{it->second.owner, note.from_node()});
  if (receiver != by_receiver_.end()) {
    receiver->second.payload_bytes -= note.payload().size();
    if (--receiver->second.live == 0) by_receiver_.erase(receiver);
  }
  by_sequence_.erase(it);
}

std::optional<ferry::v1::Notification> NotificationBoard::TakeLocked(const std::string& name,
                                                                     const std::string& from_node,
                                                                     int64_t taker) {
  auto names = by_name_.find(name);
  if (names == by_name_.end()) return std::nullopt;
  for (uint64_t seq : names->second) {
    const Entry& e = by_sequence_.at(seq);
    if (!from_node.empty() && e.note.from_node() != from_node) continue;
    if (!MayTake(e, taker)) continue;
    ferry::v1::Notification out = e.note;
    EraseLocked(seq);
    return out;
  }
  return std::nullopt;
}

absl::StatusOr<ferry::v1::Notification> NotificationBoard::Take(const std::string& name,
                                                                const std::string& from_node,
                                                                int64_t taker,
                                                                absl::Time deadline,
                                                                const CancelledFn& cancelled) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (auto n = TakeLocked(name, from_node, taker)) return *std::move(n);
    absl::Time now = absl::Now();
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("wait for notification '", name, "' was cancelled"));
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no notification '", name, "'",
                       from_node.empty() ? "" : absl::StrCat(" from ", from_node),
                       deadline == absl::InfinitePast() ? " is here (a poll does not wait)"
                                                        : " arrived before the deadline"));
    }
    posted_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(100)));
  }
}

std::optional<ferry::v1::Notification> NotificationBoard::TakePrefix(const std::string& prefix,
                                                                     int64_t taker,
                                                                     absl::Time until) {
  absl::MutexLock lock(&mu_);
  while (true) {
    for (const auto& [seq, e] : by_sequence_) {
      if (MayTake(e, taker) && absl::StartsWith(e.note.name(), prefix)) {
        ferry::v1::Notification out = e.note;
        EraseLocked(seq);
        return out;
      }
    }
    if (absl::Now() >= until) return std::nullopt;
    posted_.WaitWithDeadline(&mu_, until);
  }
}

ferry::v1::PollNotificationsResponse NotificationBoard::Poll(const std::string& prefix,
                                                            uint32_t max_count, int64_t taker) {
  ferry::v1::PollNotificationsResponse out;
  std::vector<uint64_t> taken;
  size_t bytes = 0;
  absl::MutexLock lock(&mu_);
  // Only the taker's receivers are looked at: another uid's thousands of untaken
  // notifications cost this poll nothing. Merged into arrival order.
  std::vector<uint64_t> mine;
  for (const auto& [receiver, queue] : by_receiver_) {
    if (taker != kAnyone && receiver.first != taker && receiver.first != kAnyone) continue;
    for (uint64_t seq : queue.sequences) {
      if (by_sequence_.contains(seq)) mine.push_back(seq);
    }
  }
  std::sort(mine.begin(), mine.end());
  for (uint64_t seq : mine) {
    const Entry& e = by_sequence_.at(seq);
    if (!absl::StartsWith(e.note.name(), prefix)) continue;
    const size_t size = e.note.ByteSizeLong();
    if ((max_count > 0 && taken.size() >= max_count) ||
        (!taken.empty() && bytes + size > kMaxPollBytes)) {
      out.set_more(true);
      break;
    }
    bytes += size;
    *out.add_notifications() = e.note;
    taken.push_back(seq);
  }
  for (uint64_t seq : taken) EraseLocked(seq);
  return out;
}

size_t NotificationBoard::size() const {
  absl::MutexLock lock(&mu_);
  return by_sequence_.size();
}

size_t NotificationBoard::size_for(int64_t taker) const {
  absl::MutexLock lock(&mu_);
  if (taker == kAnyone) return by_sequence_.size();
  size_t n = 0;
  for (const auto& [receiver, queue] : by_receiver_) {
    if (receiver.first == taker || receiver.first == kAnyone) n += queue.live;
  }
  return n;
}

}  // namespace ferry::server
