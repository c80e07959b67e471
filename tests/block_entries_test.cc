// Issue 46, block lists over arbitrary entries and strided runs, with two real agents: a
// decode rank at TP 4 reads its head slice of every block of a prefill rank at TP 2 (the
// prefill's cache in layout (blocks, heads, tokens, dim): heads [h0, h1) of block b at
// b * block_bytes + h0 * head_bytes, a strided run), entries of different lengths pair up
// one to one, pairs of unequal lengths are refused naming both sides, and a peer that does
// not answer costs each call its own timeout and is named: ResolveBlocks (was 10 s), a
// send's Match (was 7 s, and a bare "Deadline Exceeded"), a move on a kept answer. And a
// notification alone (Tensors.Notify) reaches the list owner's poll with its payload.

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/block_client.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/stop_process.h"

namespace ferry {
namespace {

constexpr uint64_t kHeads = 4;              // the prefill rank's KV heads
constexpr uint64_t kHeadBytes = 4 << 10;    // one head's tokens x dim x dtype in a block
constexpr uint64_t kBlock = kHeads * kHeadBytes;
constexpr uint64_t kBlocks = 8;

class BlockEntriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pair_.Start().ok());
    a_blocks_ = std::make_unique<BlockClient>(pair_.ca->shared_session());
    b_blocks_ = std::make_unique<BlockClient>(pair_.cb->shared_session());
    auto dst = pair_.ca->Alloc(kBlocks * kBlock);
    auto cache = pair_.cb->Alloc(kBlocks * kBlock, "cache");
    ASSERT_TRUE(dst.ok() && cache.ok());
    dst_ = std::move(*dst);
    cache_ = std::move(*cache);
    Fill(*cache_, 7);
    std::memset(dst_->data(), 0, dst_->size());
  }
  // node-a moves `local` of list `list` with node-b's `remote` of "kv"; the transfer's status
  // (or the move's refusal).
  absl::Status MoveAndWait(ferry::v1::OpType type, uint64_t list,
                           const std::vector<uint64_t>& local,
                           const std::vector<uint64_t>& remote, bool verify = false) {
    auto moved = a_blocks_->Move(type, list, local, "node-b", "kv", remote, "", 0, verify);
    if (!moved.ok()) return moved.status();
    auto r = pair_.ca->Wait(moved->transfer_id(), absl::Seconds(30));
    return r.ok() ? TransferStatus(*r) : r.status();
  }
  const char* CacheAt(uint64_t block, uint64_t head) const {
    return cache_->data() + block * kBlock + head * kHeadBytes;
  }

  Pair pair_;  // first: what is below goes before it checks the accounting
  std::unique_ptr<BlockClient> a_blocks_, b_blocks_;
  std::unique_ptr<Buffer> dst_, cache_;
};

TEST_F(BlockEntriesTest, ADecodeRankReadsItsHeadSliceOfEveryBlockThroughAStridedList) {
  // Prefill exports each TP-4 rank's slice as a run: rank q's blocks are q * kBlocks + b.
  std::vector<ferry::v1::BlockExtent> runs;
  constexpr uint64_t kSlice = 2 * kHeadBytes;  // a TP-4 rank's heads of a TP-2 rank's 4
  for (uint64_t q = 0; q < 2; ++q) {
    runs.push_back(Extent(cache_->id(), q * kSlice, kSlice, kBlocks, kBlock));
  }
  auto exported = b_blocks_->Prepare(runs, "kv");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->blocks(), 2 * kBlocks);
  // Decode's own cache holds its 2 heads a block, back to back.
  auto local = a_blocks_->Prepare({Extent(dst_->id(), 0, kSlice, kBlocks)});
  ASSERT_TRUE(local.ok()) << local.status();
  std::vector<uint64_t> mine, theirs;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    mine.push_back(b);
    theirs.push_back(kBlocks + b);  // rank 1: heads [2, 4)
  }
  ASSERT_TRUE(MoveAndWait(ferry::v1::READ, local->list(), mine, theirs, /*verify=*/true).ok());
  for (uint64_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(std::memcmp(dst_->data() + b * kSlice, CacheAt(b, 2), kSlice), 0) << "block " << b;
  }
  // Again on node-b's kept answer (no ResolveBlocks): rank 0's heads [0, 2), reversed.
  const uint64_t asked = PeerOf(*pair_.cb, "node-a").lists_granted();
  std::vector<uint64_t> rank0(theirs.rbegin(), theirs.rend());
  for (uint64_t& r : rank0) r -= kBlocks;
  ASSERT_TRUE(MoveAndWait(ferry::v1::READ, local->list(), mine, rank0).ok());
  EXPECT_EQ(PeerOf(*pair_.cb, "node-a").lists_granted(), asked) << "node-a asked again";
  EXPECT_GE(PeerOf(*pair_.ca, "node-b").kept_lists(), 1u);
  for (uint64_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(std::memcmp(dst_->data() + b * kSlice, CacheAt(kBlocks - 1 - b, 0), kSlice), 0)
        << "block " << b;
  }
}

TEST_F(BlockEntriesTest, EntriesOfDifferentLengthsPairUpOneToOne) {
  // Three entries anywhere in each buffer, 100, 4096 and 7 bytes long.
  const std::vector<std::pair<uint64_t, uint64_t>> theirs = {{5, 100}, {9000, 4096}, {40001, 7}};
  const std::vector<std::pair<uint64_t, uint64_t>> ours = {{3, 100}, {777, 4096}, {20000, 7}};
  std::vector<ferry::v1::BlockExtent> remote, local;
  for (auto [offset, length] : theirs) remote.push_back(Extent(cache_->id(), offset, length, 1));
  for (auto [offset, length] : ours) local.push_back(Extent(dst_->id(), offset, length, 1));
  ASSERT_TRUE(b_blocks_->Prepare(remote, "kv").ok());
  auto list = a_blocks_->Prepare(local);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->blocks(), 3u);
  ASSERT_TRUE(MoveAndWait(ferry::v1::READ, list->list(), {0, 1, 2}, {0, 1, 2}, true).ok());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(std::memcmp(dst_->data() + ours[i].first, cache_->data() + theirs[i].first,
                          ours[i].second),
              0)
        << "entry " << i;
  }
  // Untouched around them: nothing moved but the entries.
  EXPECT_EQ(dst_->data()[2], 0);
  EXPECT_EQ(dst_->data()[103], 0);
}

TEST_F(BlockEntriesTest, APairOfUnequalLengthsIsRefusedNamingBothSides) {
  ASSERT_TRUE(
      b_blocks_->Prepare({Extent(cache_->id(), 0, 100, 1), Extent(cache_->id(), 100, 64, 1)}, "kv")
          .ok());
  auto list = a_blocks_->Prepare({Extent(dst_->id(), 0, 100, 2)});
  ASSERT_TRUE(list.ok()) << list.status();
  const std::string before(cache_->data(), 200);
  absl::Status s = MoveAndWait(ferry::v1::WRITE, list->list(), {0, 1}, {0, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("local_blocks[1], remote_blocks[1]: local block 1 is 100 bytes, "
                             "block 1 of node-b's list 'kv' is 64"),
            std::string::npos)
      << s;
  // Refused whole: not even the equal pair 0 moved.
  EXPECT_EQ(std::memcmp(cache_->data(), before.data(), before.size()), 0);
}

TEST_F(BlockEntriesTest, PrepareChecksStridesAndTheLastStridedBlock) {
  // Overlapping blocks within one run: refused, naming the stride.
  auto overlap = a_blocks_->Prepare({Extent(dst_->id(), 0, 4096, 2, 1024)});
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.status().message().find("extents[0].stride: 1024 is less than block_bytes"),
            std::string::npos)
      << overlap.status();
  // A run's last block past the buffer's end (the first 7 fit): OUT_OF_RANGE naming count.
  auto past = a_blocks_->Prepare({Extent(dst_->id(), 0, kBlock, kBlocks, kBlock + 1)});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange) << past.status();
  EXPECT_NE(past.status().message().find("extents[0].count"), std::string::npos);
  // The stride of a one-block extent is never used; exactly to the end fits; different
  // extents may overlap.
  auto fits = a_blocks_->Prepare({Extent(dst_->id(), 8, 64, 1, 1),
                                  Extent(dst_->id(), kBlock - 64, 64, kBlocks, kBlock),
                                  Extent(dst_->id(), 0, 4 * kBlock, 2, 4 * kBlock)});
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->blocks(), 1 + kBlocks + 2);
}

// Tensors.Notify: a notification alone (decode's "done" or heartbeat for blocks it pulled)
// reaches the owner of the peer's list with its payload, as a move's would.
TEST_F(BlockEntriesTest, ANotificationAloneArrivesAtTheListOwnersPollWithItsPayload) {
  ASSERT_TRUE(b_blocks_->Prepare({Extent(cache_->id(), 0, kBlock, kBlocks)}, "kv").ok());
  TensorClient b_tensors(pair_.cb->shared_session());
  const std::string payload("req-17\0done", 11);
  absl::Status sent = a_blocks_->Notify("node-b", "kv", "req-17/done", payload);
  ASSERT_TRUE(sent.ok()) << sent;
  auto polled = b_tensors.PollNotifications("req-17/");
  ASSERT_TRUE(polled.ok()) << polled.status();
  ASSERT_EQ(polled->notifications_size(), 1);
  const ferry::v1::Notification& n = polled->notifications(0);
  EXPECT_EQ(n.name(), "req-17/done");
  EXPECT_EQ(n.from_node(), "node-a");
  EXPECT_EQ(n.payload(), payload);
  EXPECT_EQ(n.list(), "kv");
  EXPECT_EQ(n.code(), 0);
  EXPECT_EQ(n.blocks(), 0u);
  EXPECT_EQ(n.bytes(), 0u);
}

TEST_F(BlockEntriesTest, ANotificationForAListThePeerDoesNotHaveIsNotFoundNamingIt) {
  absl::Status sent = a_blocks_->Notify("node-b", "no-such-kv", "req-18/done", "x");
  EXPECT_EQ(sent.code(), absl::StatusCode::kNotFound) << sent;
  EXPECT_NE(sent.message().find("node-b"), std::string::npos) << sent;
  EXPECT_NE(sent.message().find("no-such-kv"), std::string::npos) << sent;
  TensorClient b_tensors(pair_.cb->shared_session());
  auto polled = b_tensors.PollNotifications("req-18/");
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_EQ(polled->notifications_size(), 0) << "delivered for a list node-b does not have";
  // Too large a payload is refused here, naming the field.
  sent = a_blocks_->Notify("node-b", "kv", "req-18/done", std::string(4097, 'p'));
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument) << sent;
  EXPECT_NE(sent.message().find("payload"), std::string::npos) << sent;
}

TEST_F(BlockEntriesTest, ANotificationToAPeerThatDoesNotAnswerEndsWithinItsTimeoutNamingIt) {
  ASSERT_TRUE(b_blocks_->Prepare({Extent(cache_->id(), 0, kBlock, kBlocks)}, "kv").ok());
  StopProcess(pair_.b->pid());
  const absl::Time start = absl::Now();
  absl::Status sent = a_blocks_->Notify("node-b", "kv", "hb", "", absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  kill(pair_.b->pid(), SIGCONT);
  EXPECT_EQ(sent.code(), absl::StatusCode::kDeadlineExceeded) << sent;
  EXPECT_NE(sent.message().find("node-b did not answer"), std::string::npos) << sent;
  EXPECT_LT(took, absl::Seconds(4)) << "the notify waited past its timeout";
}

TEST_F(BlockEntriesTest, AMoveToAPeerThatDoesNotAnswerEndsWithinItsTimeoutNamingThePeer) {
  ASSERT_TRUE(b_blocks_->Prepare({Extent(cache_->id(), 0, kBlock, kBlocks)}, "kv").ok());
  auto list = a_blocks_->Prepare({Extent(dst_->id(), 0, kBlock, kBlocks)});
  ASSERT_TRUE(list.ok()) << list.status();
  StopProcess(pair_.b->pid());  // node-b hangs; node-a has not asked it for "kv" yet
  const absl::Time start = absl::Now();
  auto moved = a_blocks_->Move(ferry::v1::READ, list->list(), {0}, "node-b", "kv", {0}, "",
                               /*timeout_ms=*/3000);
  const absl::Duration took = absl::Now() - start;
  kill(pair_.b->pid(), SIGCONT);
  ASSERT_FALSE(moved.ok());
  // Before: 10 s, and "remote_list: node-b answered: Deadline Exceeded".
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kDeadlineExceeded) << moved.status();
  EXPECT_NE(moved.status().message().find("node-b did not answer ResolveBlocks within 3 s"),
            std::string::npos)
      << moved.status();
  EXPECT_GE(took, absl::Seconds(3));
  EXPECT_LT(took, absl::Seconds(5)) << "the move waited past its timeout";
  std::printf("a move to a stopped peer ended after %s: %s\n", absl::FormatDuration(took).c_str(),
              moved.status().ToString().c_str());
  // node-b answers again: the next move goes through.
  EXPECT_TRUE(MoveAndWait(ferry::v1::READ, list->list(), {1}, {1}).ok());
}

TEST_F(BlockEntriesTest, AMoveToAPeerWhoseAgentIsGoneSaysItCouldNotBeReached) {
  ASSERT_TRUE(b_blocks_->Prepare({Extent(cache_->id(), 0, kBlock, kBlocks)}, "kv").ok());
  auto list = a_blocks_->Prepare({Extent(dst_->id(), 0, kBlock, kBlocks)});
  ASSERT_TRUE(list.ok()) << list.status();
  b_blocks_.reset();
  pair_.cb.reset();
  pair_.b->Stop();  // node-b's agent is gone: nothing listens on its port
  auto moved = a_blocks_->Move(ferry::v1::READ, list->list(), {0}, "node-b", "kv", {0}, "", 3000);
  ASSERT_FALSE(moved.ok());
  // Before: "remote_list: node-b answered: failed to connect to all addresses", as if node-b
  // had said it.
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kUnavailable) << moved.status();
  EXPECT_NE(moved.status().message().find("node-b could not be reached"), std::string::npos)
      << moved.status();
  EXPECT_EQ(moved.status().message().find("answered"), std::string::npos) << moved.status();
  std::printf("a move to a peer whose agent is gone: %s\n", moved.status().ToString().c_str());
}

TEST_F(BlockEntriesTest, ASendAndAMoveOnAKeptAnswerToAPeerThatDoesNotAnswerNameIt) {
  ASSERT_TRUE(b_blocks_->Prepare({Extent(cache_->id(), 0, kBlock, kBlocks)}, "kv").ok());
  auto list = a_blocks_->Prepare({Extent(dst_->id(), 0, kBlock, kBlocks)});
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_TRUE(MoveAndWait(ferry::v1::READ, list->list(), {0}, {0}).ok());  // kept from here
  TensorClient tensors(pair_.ca->shared_session());
  auto unasked = pair_.cb->Alloc(4096, "unasked");  // node-a has not resolved it
  ASSERT_TRUE(unasked.ok()) << unasked.status();
  StopProcess(pair_.b->pid());
  absl::Time run_start = absl::Now();
  auto ran = pair_.ca->Run({{ferry::v1::WRITE, dst_->id(), 0, "node-b", "unasked", 0, 4096}},
                           absl::Seconds(2));
  const absl::Duration run_took = absl::Now() - run_start;
  absl::Time start = absl::Now();
  auto sent = tensors.Send(dst_->id(), 0, MakeMeta(ferry::v1::DTYPE_UINT8, {4096}, "t"),
                           "node-b", {.timeout = absl::Seconds(2)});
  const absl::Duration send_took = absl::Now() - start;
  start = absl::Now();
  absl::Status moved = [&]() -> absl::Status {
    auto m = a_blocks_->Move(ferry::v1::READ, list->list(), {1}, "node-b", "kv", {1}, "", 2000);
    if (!m.ok()) return m.status();
    auto r = pair_.ca->Wait(m->transfer_id(), absl::Seconds(30));
    return r.ok() ? TransferStatus(*r) : r.status();
  }();
  const absl::Duration move_took = absl::Now() - start;
  kill(pair_.b->pid(), SIGCONT);
  // Before: 7 s, and the client's own "Deadline Exceeded" (the agent asked for 5.5 s, then
  // waited 5 s more to withdraw the offer from the silent peer).
  EXPECT_EQ(sent.status().code(), absl::StatusCode::kDeadlineExceeded) << sent.status();
  EXPECT_NE(sent.status().message().find("send of 't' to node-b: node-b did not answer Match "
                                         "within"),
            std::string::npos)
      << sent.status();
  EXPECT_LT(send_took, absl::Seconds(3)) << sent.status();
  // The transfer ends at its deadline ("transfer 7 to node-b did not finish before its
  // deadline"), or before, when the rails' Hello (older than 2 s by now) went unanswered
  // ("peer node-b did not answer Hello"): either way it names node-b.
  EXPECT_TRUE(moved.code() == absl::StatusCode::kDeadlineExceeded ||
              moved.code() == absl::StatusCode::kUnavailable)
      << moved;
  EXPECT_NE(moved.message().find("node-b did not"), std::string::npos) << moved;
  EXPECT_LT(move_took, absl::Seconds(3)) << moved;
  // A transfer to a buffer it must first resolve: "... asking node-b for buffer 'unasked':
  // node-b did not answer ResolveBuffer within 2 s" (was "...: Deadline Exceeded").
  const absl::Status run = ran.ok() ? TransferStatus(*ran) : ran.status();
  EXPECT_NE(run.message().find("node-b did not answer ResolveBuffer within"), std::string::npos)
      << run;
  EXPECT_LT(run_took, absl::Seconds(3)) << run;
  unasked->reset();
  std::printf("send: %s after %s; move: %s after %s\n", sent.status().ToString().c_str(),
              absl::FormatDuration(send_took).c_str(), moved.ToString().c_str(),
              absl::FormatDuration(move_took).c_str());
}

}  // namespace
}  // namespace ferry
