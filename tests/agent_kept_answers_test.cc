// Kept ResolveBuffer answers with two real agents: node-a keeps node-b's answer after the
// first transfer and asks node-b nothing after (ListPeers: kept_answers on node-a,
// answers_held and answers_granted on node-b), and loses it before it could reach the wrong
// memory: when node-b frees the buffer (Free returns after the transfer on it finished; the
// name reused then reaches the new buffer, with the new size), when the owning session
// ends, when node-b changes its policy or restarts. A node-b that does not know node-a
// answers without letting it keep anything (a buffer's answer or a list's), and nobody but
// node-b revokes its answers.

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/block_client.h"
#include "client/ferry_client.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/peer_channel.h"

namespace ferry {
namespace {

constexpr uint64_t kSize = 1 << 20;

class AgentKeptAnswersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pair_.Start().ok());
    auto src = pair_.ca->Alloc(kSize);
    ASSERT_TRUE(src.ok()) << src.status();
    src_ = std::move(*src);
    Fill(*src_, 7);
  }
  // node-a writes its whole source into node-b's `name`.
  absl::Status WriteAll(const std::string& name, uint64_t length = kSize) {
    return pair_.ca->Write(*src_, 0, "node-b", name, 0, length);
  }
  // node-b's buffer `name`, written once by node-a, which now keeps node-b's answer for it.
  void AllocKept(const std::string& name, std::unique_ptr<Buffer>* out) {
    auto dst = pair_.cb->Alloc(kSize, name);
    ASSERT_TRUE(dst.ok()) << dst.status();
    ASSERT_TRUE(WriteAll(name).ok());
    ASSERT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 1u);
    *out = std::move(*dst);
  }
  Pair pair_;
  std::unique_ptr<Buffer> src_;
};

TEST_F(AgentKeptAnswersTest, TheSecondTransferToABufferUsesTheKeptAnswer) {
  auto dst = pair_.cb->Alloc(kSize, "kept");
  ASSERT_TRUE(dst.ok()) << dst.status();
  EXPECT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 0u);
  ASSERT_TRUE(WriteAll("kept").ok());
  EXPECT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 1u);
  EXPECT_EQ(PeerOf(*pair_.cb, "node-a").answers_held(), 1u);
  EXPECT_EQ(PeerOf(*pair_.cb, "node-a").answers_granted(), 1u);
  for (uint32_t seed = 8; seed < 11; ++seed) {
    Fill(*src_, seed);
    ASSERT_TRUE(WriteAll("kept").ok());
    EXPECT_EQ(0, std::memcmp(src_->data(), (*dst)->data(), kSize));
  }
  // Every ResolveBuffer node-a makes is granted (node-b knows it): still one, so the three
  // writes after the first asked node-b nothing.
  EXPECT_EQ(PeerOf(*pair_.cb, "node-a").answers_granted(), 1u);
  EXPECT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 1u);
}

TEST_F(AgentKeptAnswersTest, FreeWaitsForTheTransferThatUsesTheKeptAnswer) {
  constexpr uint64_t kBig = 64ull << 20;
  auto big = pair_.ca->Alloc(kBig);
  auto dst = pair_.cb->Alloc(kBig, "busy");
  ASSERT_TRUE(big.ok() && dst.ok());
  ASSERT_TRUE(pair_.ca->Write(**big, 0, "node-b", "busy", 0, 4096).ok());  // kept now
  std::vector<OpSpec> ops;
  for (int i = 0; i < 4; ++i)
    ops.push_back({ferry::v1::WRITE, (*big)->id(), 0, "node-b", "busy", 0, kBig});
  auto id = pair_.ca->Submit(ops, absl::Seconds(30));
  ASSERT_TRUE(id.ok()) << id.status();
  // The transfer holds the kept answer: node-b's Free revokes it and returns only once the
  // transfer let go of it, so the transfer is not cut off by its keys going away.
  ASSERT_TRUE(pair_.cb->Free((*dst)->id()).ok());
  auto result = pair_.ca->Wait(*id, absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->state(), ferry::v1::SUCCEEDED) << result->message();
  EXPECT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 0u);
}

TEST_F(AgentKeptAnswersTest, ASessionEndingRevokesWhatItOwned) {
  std::unique_ptr<Buffer> dst;
  ASSERT_NO_FATAL_FAILURE(AllocKept("owned", &dst));
  dst.reset();
  pair_.cb.reset();  // node-b frees the session's buffers once it sees the client gone
  absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (PeerOf(*pair_.ca, "node-b").kept_answers() != 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 0u);
  absl::Status gone = WriteAll("owned");
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  auto cb = Client::Connect(pair_.b->socket());
  ASSERT_TRUE(cb.ok());
  pair_.cb = std::move(*cb);
}

TEST_F(AgentKeptAnswersTest, FreeingTheBufferRevokesTheAnswerBeforeFreeReturns) {
  std::unique_ptr<Buffer> dst;
  ASSERT_NO_FATAL_FAILURE(AllocKept("reused", &dst));

  ASSERT_TRUE(pair_.cb->Free(dst->id()).ok());
  dst.reset();
  // No polling: Free returned after node-a confirmed.
  EXPECT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 0u);
  EXPECT_EQ(PeerOf(*pair_.cb, "node-a").answers_held(), 0u);
  absl::Status gone = WriteAll("reused");
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;

  // The name again, half the size: node-a sees the new buffer, not the answer it had.
  auto smaller = pair_.cb->Alloc(kSize / 2, "reused");
  ASSERT_TRUE(smaller.ok()) << smaller.status();
  std::memset((*smaller)->data(), 0, kSize / 2);
  absl::Status too_long = WriteAll("reused");
  EXPECT_EQ(too_long.code(), absl::StatusCode::kOutOfRange) << too_long;
  Fill(*src_, 9);
  ASSERT_TRUE(WriteAll("reused", kSize / 2).ok());
  EXPECT_EQ(0, std::memcmp(src_->data(), (*smaller)->data(), kSize / 2));
}

TEST_F(AgentKeptAnswersTest, APolicyChangeRevokesEveryAnswer) {
  auto one = pair_.cb->Alloc(kSize, "one");
  auto two = pair_.cb->Alloc(kSize, "two");
  ASSERT_TRUE(one.ok() && two.ok());
  ASSERT_TRUE(WriteAll("one").ok());
  ASSERT_TRUE(WriteAll("two").ok());
  ASSERT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 2u);
  ASSERT_TRUE(pair_.cb->SetPolicy({{"fallback", "fail"}}).ok());
  EXPECT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 0u);
  EXPECT_EQ(PeerOf(*pair_.cb, "node-a").answers_held(), 0u);
  ASSERT_TRUE(WriteAll("one").ok());  // host memory: the new policy still takes it
}

TEST_F(AgentKeptAnswersTest, ARestartedPeerIsAskedAgain) {
  std::unique_ptr<Buffer> dst;
  ASSERT_NO_FATAL_FAILURE(AllocKept("again", &dst));
  dst.reset();
  pair_.cb.reset();
  pair_.b->Kill();
  ASSERT_TRUE(pair_.StartB().ok());
  auto fresh = pair_.cb->Alloc(kSize, "again");
  ASSERT_TRUE(fresh.ok());
  std::memset((*fresh)->data(), 0, kSize);
  Fill(*src_, 10);
  absl::Status s = WriteAll("again");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(0, std::memcmp(src_->data(), (*fresh)->data(), kSize));
}

TEST_F(AgentKeptAnswersTest, OnlyTheExporterRevokesItsAnswers) {
  std::unique_ptr<Buffer> dst;
  ASSERT_NO_FATAL_FAILURE(AllocKept("mine", &dst));
  // node-c, with a good certificate of its own, claims to be node-b: refused.
  auto as_c = ferry::v1::Peer::NewStub(
      PeerChannelAs(pair_.dir, pair_.a->peer_address(), "node-a", "node-c"));
  ferry::v1::RevokeRequest forged;
  forged.set_from_node("node-b");
  forged.set_all(true);
  ferry::v1::RevokeResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = as_c->Revoke(&ctx, forged, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  // As itself, node-c drops only what node-a keeps of node-c's: nothing.
  ferry::v1::RevokeRequest own;
  own.set_from_node("node-c");
  own.set_all(true);
  grpc::ClientContext ctx2;
  ASSERT_TRUE(as_c->Revoke(&ctx2, own, &resp).ok());
  EXPECT_EQ(resp.dropped(), 0u);
  EXPECT_EQ(PeerOf(*pair_.ca, "node-b").kept_answers(), 1u);
}

TEST(AgentKeptAnswersOneWayTest, AnExporterThatCannotCallBackLetsNothingBeKept) {
  Pair pair;
  pair.dir = MakeTempDir();
  auto pa = PickFreePort();
  auto pb = PickFreePort();
  ASSERT_TRUE(pa.ok() && pb.ok());
  pair.port_a = *pa;
  pair.port_b = *pb;
  // node-b has no peers: it answers node-a (authenticated by its certificate) but could not
  // tell it when the answer goes stale.
  auto b = AgentProcess::Start({"node-b", pair.dir, pair.port_b, {}, ""});
  ASSERT_TRUE(b.ok()) << b.status();
  pair.b = std::move(*b);
  auto a = AgentProcess::Start(pair.SpecA(""));
  ASSERT_TRUE(a.ok()) << a.status();
  pair.a = std::move(*a);
  auto ca = Client::Connect(pair.a->socket());
  auto cb = Client::Connect(pair.b->socket());
  ASSERT_TRUE(ca.ok() && cb.ok());
  pair.ca = std::move(*ca);
  pair.cb = std::move(*cb);
  auto src = pair.ca->Alloc(kSize);
  auto dst = pair.cb->Alloc(kSize, "unkept");
  ASSERT_TRUE(src.ok() && dst.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pair.ca->Write(**src, 0, "node-b", "unkept", 0, kSize).ok());
  }
  EXPECT_EQ(PeerOf(*pair.ca, "node-b").kept_answers(), 0u);
  {
    // Nor is a list's answer kept: each move asks again.
    BlockClient a_blocks(pair.ca->shared_session()), b_blocks(pair.cb->shared_session());
    auto exported = b_blocks.Prepare({Extent((*dst)->id(), 0, 4096, 4)}, "unkept-list");
    auto local = a_blocks.Prepare({Extent((*src)->id(), 0, 4096, 4)});
    ASSERT_TRUE(exported.ok() && local.ok());
    for (uint64_t block = 0; block < 2; ++block) {
      auto moved = a_blocks.Move(ferry::v1::WRITE, local->list(), {block}, "node-b",
                                 "unkept-list", {block});
      ASSERT_TRUE(moved.ok()) << moved.status();
      auto done = pair.ca->Wait(moved->transfer_id(), absl::Seconds(30));
      ASSERT_TRUE(done.ok() && done->state() == ferry::v1::SUCCEEDED);
    }
    EXPECT_EQ(PeerOf(*pair.ca, "node-b").kept_lists(), 0u);
    ASSERT_TRUE(b_blocks.Release(exported->list()).ok());
    ASSERT_TRUE(a_blocks.Release(local->list()).ok());
  }
  ASSERT_TRUE(pair.cb->Free((*dst)->id()).ok());
  absl::Status gone = pair.ca->Write(**src, 0, "node-b", "unkept", 0, kSize);
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
}

}  // namespace
}  // namespace ferry
