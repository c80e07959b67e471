#include "server/peers/resolve_cache.h"

#include "absl/algorithm/container.h"
#include "absl/time/clock.h"

namespace ferry::server {

template <typename Answer>
std::shared_ptr<const Answer> ResolveCache::FindIn(Kept<Answer> Peer::*kind,
                                                   const std::string& node,
                                                   const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(node);
  if (peer == peers_.end()) return nullptr;
  const Kept<Answer>& kept = peer->second.*kind;
  auto it = kept.find(name);
  return it == kept.end() ? nullptr : it->second;
}

template <typename Answer>
std::shared_ptr<const Answer> ResolveCache::KeepIn(Kept<Answer> Peer::*kind, uint64_t epoch,
                                                   std::shared_ptr<const Answer> answer) {
  absl::MutexLock lock(&mu_);
  Peer& peer = peers_[answer->node];
  if (peer.epoch != epoch) return nullptr;  // revoked while the answer was on its way
  auto [it, added] = (peer.*kind).try_emplace(answer->name, answer);
  return it->second;
}

template <typename Answer>
void ResolveCache::ForgetIn(Kept<Answer> Peer::*kind, const Answer* answer) {
  if (answer == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(answer->node);
  if (peer == peers_.end()) return;
  Kept<Answer>& kept = peer->second.*kind;
  auto it = kept.find(answer->name);
  if (it != kept.end() && it->second.get() == answer) kept.erase(it);
}

template <typename Answer>
size_t ResolveCache::CountIn(Kept<Answer> Peer::*kind, const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(node);
  return peer == peers_.end() ? 0 : (peer->second.*kind).size();
}

std::shared_ptr<const RemoteBuffer> ResolveCache::Find(const std::string& node,
                                                       const std::string& name) {
  return FindIn(&Peer::answers, node, name);
}

std::shared_ptr<const RemoteBuffer> ResolveCache::Keep(
    uint64_t epoch, std::shared_ptr<const RemoteBuffer> answer) {
  return KeepIn(&Peer::answers, epoch, std::move(answer));
}

void ResolveCache::Forget(const RemoteBuffer* answer) {
  ForgetIn(&Peer::answers, answer);
}

size_t ResolveCache::KeptFrom(const std::string& node) const {
  return CountIn(&Peer::answers, node);
}

std::shared_ptr<const RemoteList> ResolveCache::FindList(const std::string& node,
                                                         const std::string& name) {
  auto answer = FindIn(&Peer::lists, node, name);
  if (answer != nullptr && absl::Now() - answer->asked_at > kListAnswerTtl) {
    ForgetList(answer);
    return nullptr;
  }
  return answer;
}

std::shared_ptr<const RemoteList> ResolveCache::KeepList(uint64_t epoch,
                                                         std::shared_ptr<const RemoteList> answer) {
  return KeepIn(&Peer::lists, epoch, std::move(answer));
}

void ResolveCache::ForgetList(const std::shared_ptr<const RemoteList>& answer) {
  ForgetIn(&Peer::lists, answer.get());
}

size_t ResolveCache::ListsKeptFrom(const std::string& node) const {
  return CountIn(&Peer::lists, node);
}

uint64_t ResolveCache::Epoch(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(node);
  return peer == peers_.end() ? 0 : peer->second.epoch;
}

std::vector<std::weak_ptr<const RemoteBuffer>> ResolveCache::Revoke(
    const std::string& node, const std::vector<std::string>& names, bool all,
    const std::vector<std::string>& lists,
    std::vector<std::weak_ptr<const RemoteList>>* lists_dropped) {
  std::vector<std::weak_ptr<const RemoteBuffer>> dropped;
  absl::MutexLock lock(&mu_);
  Peer& peer = peers_[node];
  ++peer.epoch;
  auto drop_list = [&](auto it) {
    if (lists_dropped != nullptr) lists_dropped->push_back(it->second);
    return peer.lists.erase(it);
  };
  if (all) {
    for (auto& [name, answer] : peer.answers) dropped.push_back(answer);
    peer.answers.clear();
    for (auto it = peer.lists.begin(); it != peer.lists.end();) it = drop_list(it);
    return dropped;
  }
  for (const std::string& name : names) {
    auto it = peer.answers.find(name);
    if (it == peer.answers.end()) continue;
    dropped.push_back(it->second);
    peer.answers.erase(it);
  }
  for (const std::string& name : lists) {
    auto it = peer.lists.find(name);
    if (it != peer.lists.end()) drop_list(it);
  }
  // A list lying in a buffer that went says where nothing is any more.
  for (auto it = peer.lists.begin(); it != peer.lists.end();) {
    const RemoteList& list = *it->second;
    if (absl::c_any_of(names, [&](const std::string& n) { return list.Names(n); })) {
      it = drop_list(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

}  // namespace ferry::server
