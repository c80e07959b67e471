#pragma once
// The ResolveBuffer answers this agent keeps, per peer, so that a transfer to a buffer it
// resolved before costs no peer call. Only answers the peer marked `revocable` are kept:
// that peer calls Revoke before an answer goes stale (the buffer freed or unexported, its
// policy changed, it drains), and a peer that restarted (new incarnation) or moved loses all
// of its answers here. A transfer that fails on a kept answer drops it too (Forget).
//
// The peer's ResolveBlocks answers for the block lists it exports are kept the same way
// (KeepList): a list's answer goes when the peer revokes the list, or any buffer the list
// lies in, or everything. A list's answer has no key behind it that could stop a move on a
// stale one (its buffers stay; only the blocks' order changed), so it is also asked again
// kListAnswerTtl after it was given: a revocation that never reached us (the peer logs
// it) misplaces blocks for that long at most.
//
// The race a cache must not lose: an answer in flight while the peer revokes it. Each peer
// has an epoch, bumped by every revocation; an answer is kept, or used, only if no
// revocation of that peer came between asking (Epoch) and keeping (Keep, KeepList).

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/peers/remote_buffer.h"
#include "server/peers/remote_list.h"

namespace ferry::server {

class ResolveCache {
 public:
  static constexpr absl::Duration kListAnswerTtl = absl::Seconds(10);

  // The kept answer for `name` on `node`, or nullptr.
  std::shared_ptr<const RemoteBuffer> Find(const std::string& node, const std::string& name);
  // `node`'s epoch now: take it before asking the peer, and hand it to Keep.
  uint64_t Epoch(const std::string& node) const;
  // Keeps revocable `answer` (for answer->node, answer->name) and returns the answer to
  // use: the one already kept for that buffer if there is one (two transfers that asked at
  // once share one answer, so a revocation finds every user), else `answer`. nullptr when
  // that peer revoked anything since `epoch`: the answer may name memory already given back,
  // so it must not be used at all (ask again).
  std::shared_ptr<const RemoteBuffer> Keep(uint64_t epoch,
                                           std::shared_ptr<const RemoteBuffer> answer);
  // Drops `node`'s answers for buffers `names` and lists `lists`, and those of its lists
  // that lie in one of `names` (every answer when `all`), and bumps its epoch. Returns the
  // dropped buffer answers, still referenced where a transfer holds them: Drained() says
  // when none is. `lists_dropped`, when given, gets the dropped list answers the same way
  // (a move on one holds it until it finished).
  std::vector<std::weak_ptr<const RemoteBuffer>> Revoke(
      const std::string& node, const std::vector<std::string>& names, bool all,
      const std::vector<std::string>& lists = {},
      std::vector<std::weak_ptr<const RemoteList>>* lists_dropped = nullptr);
  // Drops `answer` if it is still the kept one for its buffer (a transfer on it failed).
  // The caller holds `answer` (its batch does), so no newer answer can have its address.
  void Forget(const RemoteBuffer* answer);
  // How many answers from `node` are kept.
  size_t KeptFrom(const std::string& node) const;

  // The same for list answers: the kept answer for list `name` on `node`, or nullptr;
  // keeping one (the one already kept for that list if there is one; nullptr when revoked
  // since `epoch`: ask again); dropping it after a move on it failed.
  std::shared_ptr<const RemoteList> FindList(const std::string& node, const std::string& name);
  std::shared_ptr<const RemoteList> KeepList(uint64_t epoch,
                                             std::shared_ptr<const RemoteList> answer);
  void ForgetList(const std::shared_ptr<const RemoteList>& answer);
  size_t ListsKeptFrom(const std::string& node) const;

  // Waits until no one holds any of `answers` or `deadline` passes; true when none is held.
  template <typename Answer>
  static bool Drained(const std::vector<std::weak_ptr<const Answer>>& answers,
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

 private:
  template <typename Answer>
  using Kept = std::map<std::string, std::shared_ptr<const Answer>>;  // by buffer or list name
  struct Peer {
    uint64_t epoch = 0;
    Kept<RemoteBuffer> answers;
    Kept<RemoteList> lists;
  };
  // Find, Keep, Forget and KeptFrom for one kind of answer (`kind`: answers or lists).
  template <typename Answer>
  std::shared_ptr<const Answer> FindIn(Kept<Answer> Peer::*kind, const std::string& node,
                                       const std::string& name);
  template <typename Answer>
  std::shared_ptr<const Answer> KeepIn(Kept<Answer> Peer::*kind, uint64_t epoch,
                                       std::shared_ptr<const Answer> answer);
  template <typename Answer>
  void ForgetIn(Kept<Answer> Peer::*kind, const Answer* answer);
  template <typename Answer>
  size_t CountIn(Kept<Answer> Peer::*kind, const std::string& node) const;

  mutable absl::Mutex mu_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
