// The asker's cache of ResolveBuffer answers: answers for one buffer are shared, an answer
// that was on its way while the peer revoked is refused (neither kept nor used), Forget
// drops only the answer a failed transfer used, and Drained waits for the transfers still
// holding one. ResolveBlocks answers (lists) go with their name, with any buffer they lie
// in, and with everything, and obey the same epoch.

#include "server/peers/resolve_cache.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ferry::server {
namespace {

std::shared_ptr<const RemoteBuffer> Answer(const std::string& node, const std::string& name) {
  auto a = std::make_shared<RemoteBuffer>();
  a->node = node;
  a->name = name;
  a->size = 4096;
  a->revocable = true;
  return a;
}

// node's list `name` over buffers `buffers`, one extent each.
std::shared_ptr<const RemoteList> ListAnswer(const std::string& node, const std::string& name,
                                             const std::vector<std::string>& buffers) {
  auto a = std::make_shared<RemoteList>();
  a->node = node;
  a->name = name;
  for (const std::string& b : buffers) {
    ferry::v1::RemoteExtent* e = a->answer.add_extents();
    e->set_buffer(b);
    e->set_block_bytes(4096);
    e->set_count(4);
  }
  a->answer.set_revocable(true);
  a->asked_at = absl::Now();
  return a;
}

TEST(ResolveCacheTest, TwoAnswersForOneBufferShareTheFirstKept) {
  ResolveCache cache;
  auto first = Answer("b", "x");
  auto second = Answer("b", "x");
  // Two transfers asked at once: both use the first answer kept, so a revocation that
  // finds it finds every transfer that uses it.
  EXPECT_EQ(cache.Keep(cache.Epoch("b"), first), first);
  EXPECT_EQ(cache.Keep(cache.Epoch("b"), second), first);
  EXPECT_EQ(cache.Find("b", "x"), first);
  EXPECT_EQ(cache.Find("c", "x"), nullptr);  // per peer
  EXPECT_EQ(cache.KeptFrom("b"), 1u);
}

TEST(ResolveCacheTest, AnAnswerInFlightDuringARevocationIsNotKept) {
  ResolveCache cache;
  const uint64_t asked = cache.Epoch("b");
  // The peer revokes (a name it is freeing) while our question is on its way...
  EXPECT_TRUE(cache.Revoke("b", {"x"}, false).empty());
  // ...so the answer that arrives after is neither kept nor to be used.
  EXPECT_EQ(cache.Keep(asked, Answer("b", "x")), nullptr);
  EXPECT_EQ(cache.KeptFrom("b"), 0u);
  // Another peer's revocations do not matter.
  const uint64_t c_asked = cache.Epoch("c");
  cache.Revoke("b", {}, true);
  EXPECT_NE(cache.Keep(c_asked, Answer("c", "x")), nullptr);
}

TEST(ResolveCacheTest, RevokeDropsTheNamedAnswersOrAll) {
  ResolveCache cache;
  for (const char* name : {"x", "y", "z"}) cache.Keep(cache.Epoch("b"), Answer("b", name));
  EXPECT_EQ(cache.Revoke("b", {"y", "nothing"}, false).size(), 1u);
  EXPECT_EQ(cache.Find("b", "y"), nullptr);
  EXPECT_NE(cache.Find("b", "x"), nullptr);
  EXPECT_EQ(cache.Revoke("b", {}, true).size(), 2u);
  EXPECT_EQ(cache.KeptFrom("b"), 0u);
}

TEST(ResolveCacheTest, ForgetDropsOnlyTheAnswerThatFailed) {
  ResolveCache cache;
  auto old_answer = Answer("b", "x");
  cache.Keep(cache.Epoch("b"), old_answer);
  cache.Forget(old_answer.get());
  EXPECT_EQ(cache.Find("b", "x"), nullptr);
  // A transfer on the old answer failing after a newer one was kept leaves the newer.
  auto newer = Answer("b", "x");
  cache.Keep(cache.Epoch("b"), newer);
  cache.Forget(old_answer.get());
  EXPECT_EQ(cache.Find("b", "x"), newer);
  cache.Forget(nullptr);
}

TEST(ResolveCacheTest, DrainedWaitsForTheTransfersThatHoldAnAnswer) {
  ResolveCache cache;
  cache.Keep(cache.Epoch("b"), Answer("b", "x"));
  std::shared_ptr<const RemoteBuffer> in_use = cache.Find("b", "x");
  auto dropped = cache.Revoke("b", {"x"}, false);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_FALSE(ResolveCache::Drained(dropped, absl::Now() + absl::Milliseconds(20)));
  std::thread finishes([&] {
    absl::SleepFor(absl::Milliseconds(30));
    in_use.reset();
  });
  EXPECT_TRUE(ResolveCache::Drained(dropped, absl::Now() + absl::Seconds(10)));
  finishes.join();
}


TEST(ResolveCacheTest, AListGoesWithItsNameWithABufferItLiesInAndWithEverything) {
  ResolveCache cache;
  auto keep = [&](const std::string& name, const std::vector<std::string>& buffers) {
    return cache.KeepList(cache.Epoch("b"), ListAnswer("b", name, buffers));
  };
  ASSERT_NE(keep("kv", {"k0", "v0"}), nullptr);
  ASSERT_NE(keep("other", {"x"}), nullptr);
  ASSERT_NE(cache.KeepList(cache.Epoch("c"), ListAnswer("c", "kv", {"k0"})), nullptr);
  EXPECT_EQ(cache.ListsKeptFrom("b"), 2u);

  // Released: the list by name; no buffer answer goes with it.
  std::vector<std::weak_ptr<const RemoteList>> dropped;
  EXPECT_TRUE(cache.Revoke("b", {}, false, {"kv"}, &dropped).empty());
  EXPECT_EQ(dropped.size(), 1u);
  EXPECT_EQ(cache.FindList("b", "kv"), nullptr);
  EXPECT_NE(cache.FindList("b", "other"), nullptr);

  // A buffer it lies in freed: the list says where nothing is any more.
  auto held = keep("kv", {"k0", "v0"});  // a move on it holds it
  ASSERT_NE(held, nullptr);
  dropped.clear();
  cache.Revoke("b", {"v0"}, false, {}, &dropped);
  EXPECT_EQ(dropped.size(), 1u);
  // The revocation's answer waits for the move that holds it.
  EXPECT_FALSE(ResolveCache::Drained(dropped, absl::Now() + absl::Milliseconds(20)));
  held.reset();
  EXPECT_TRUE(ResolveCache::Drained(dropped, absl::Now() + absl::Seconds(1)));
  EXPECT_EQ(cache.FindList("b", "kv"), nullptr);
  EXPECT_NE(cache.FindList("b", "other"), nullptr);

  // Everything (the peer restarted or drains); the other peer's stays.
  dropped.clear();
  cache.Revoke("b", {}, true, {}, &dropped);
  EXPECT_EQ(dropped.size(), 1u);
  EXPECT_EQ(cache.ListsKeptFrom("b"), 0u);
  EXPECT_NE(cache.FindList("c", "kv"), nullptr);
}

TEST(ResolveCacheTest, AListAnswerInFlightDuringARevocationIsNotKept) {
  ResolveCache cache;
  const uint64_t asked = cache.Epoch("b");
  cache.Revoke("b", {}, false, {"kv"});
  EXPECT_EQ(cache.KeepList(asked, ListAnswer("b", "kv", {"k0"})), nullptr);
  EXPECT_EQ(cache.ListsKeptFrom("b"), 0u);
  // Two moves that asked at once share the first answer kept.
  const uint64_t now = cache.Epoch("b");
  auto first = cache.KeepList(now, ListAnswer("b", "kv", {"k0"}));
  auto second = cache.KeepList(now, ListAnswer("b", "kv", {"k0"}));
  EXPECT_EQ(first, second);
  // ForgetList drops only the answer a failed move used.
  cache.ForgetList(ListAnswer("b", "kv", {"k0"}));
  EXPECT_EQ(cache.FindList("b", "kv"), first);
  cache.ForgetList(first);
  EXPECT_EQ(cache.FindList("b", "kv"), nullptr);
}

TEST(ResolveCacheTest, AListAnswerIsAskedAgainOnceItsTimePassed) {
  ResolveCache cache;
  auto old = std::make_shared<RemoteList>(*ListAnswer("b", "kv", {"k0"}));
  old->asked_at = absl::Now() - ResolveCache::kListAnswerTtl - absl::Seconds(1);
  ASSERT_NE(cache.KeepList(cache.Epoch("b"), old), nullptr);
  EXPECT_EQ(cache.FindList("b", "kv"), nullptr);
  EXPECT_EQ(cache.ListsKeptFrom("b"), 0u);
  ASSERT_NE(cache.KeepList(cache.Epoch("b"), ListAnswer("b", "kv", {"k0"})), nullptr);
  EXPECT_NE(cache.FindList("b", "kv"), nullptr);
}

}  // namespace
}  // namespace ferry::server
