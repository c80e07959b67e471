#include "server/peers/resolve_cache.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace ferry::server {

std::shared_ptr<const RemoteBuffer> ResolveCache::Find(const std::string& node,
                                                       const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(node);
  if (peer == peers_.end()) return nullptr;
  auto it = peer->second.answers.find(name);
  return it == peer->second.answers.end() ? nullptr : it->second;
}

uint64_t ResolveCache::Epoch(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(node);
  return peer == peers_.end() ? 0 : peer->second.epoch;
}

std::shared_ptr<const RemoteBuffer> ResolveCache::Keep(
    uint64_t epoch, std::shared_ptr<const RemoteBuffer> answer) {
  absl::MutexLock lock(&mu_);
  Peer& peer = peers_[answer->node];
  if (peer.epoch != epoch) return nullptr;  // revoked while the answer was on its way
  auto [it, added] = peer.answers.try_emplace(answer->name, answer);
  return it->second;
}

std::vector<std::weak_ptr<const RemoteBuffer>> ResolveCache::Revoke(
    const std::string& node, const std::vector<std::string>& names, bool all) {
  std::vector<std::weak_ptr<const RemoteBuffer>> dropped;
  absl::MutexLock lock(&mu_);
  Peer& peer = peers_[node];
  ++peer.epoch;
  if (all) {
    for (auto& [name, answer] : peer.answers) dropped.push_back(answer);
    peer.answers.clear();
    return dropped;
  }
  for (const std::string& name : names) {
    auto it = peer.answers.find(name);
    if (it == peer.answers.end()) continue;
    dropped.push_back(it->second);
    peer.answers.erase(it);
  }
  return dropped;
}

void ResolveCache::Forget(const std::shared_ptr<const RemoteBuffer>& answer) {
  if (answer == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(answer->node);
  if (peer == peers_.end()) return;
  auto it = peer->second.answers.find(answer->name);
  if (it != peer->second.answers.end() && it->second == answer) peer->second.answers.erase(it);
}

size_t ResolveCache::KeptFrom(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(node);
  return peer == peers_.end() ? 0 : peer->second.answers.size();
}

bool ResolveCache::Drained(const std::vector<std::weak_ptr<const RemoteBuffer>>& answers,
                           absl::Time deadline) {
  // Transfers let go of their plan when they finish, which no callback announces here; a
  // revocation is rare (a buffer freed, a policy change), so a short poll is enough.
  auto held = [&] {
    return std::any_of(answers.begin(), answers.end(),
                       [](const auto& a) { return !a.expired(); });
  };
  while (held()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace ferry::server
