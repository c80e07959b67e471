// RequestArena keeps its first block across requests and grows it to what a request took,
// so a steady run of batches adds no blocks; TransferMessages keeps the arenas of done
// Agent.Transfer calls (up to kKeptArenas) and hands them out empty.

#include "server/api/request_arena.h"

#include <vector>

#include "ferry/v1/agent.pb.h"
#include "gtest/gtest.h"
#include "server/api/unary_transfer.h"

namespace ferry::server {
namespace {

using google::protobuf::Arena;

// A batch as a client sends it: `ops` ops whose buffer names need heap strings.
void FillBatch(ferry::v1::TransferRequest* request, int ops) {
  for (int i = 0; i < ops; ++i) {
    ferry::v1::Op* op = request->mutable_submit()->add_ops();
    op->set_local_buffer(7);
    op->set_peer("node-b");
    op->set_remote_buffer("a-remote-buffer-name-over-sso");
    op->set_remote_offset(uint64_t{4096} * i);
    op->set_length(4096);
  }
}

TEST(RequestArenaTest, TheKeptBlockGrowsToTheLargestRequestAndARepeatAddsNoBlock) {
  RequestArena arena;
  EXPECT_EQ(arena.kept_block(), RequestArena::kFirstBlock);
  // One op fits the first block: nothing grows.
  FillBatch(Arena::CreateMessage<ferry::v1::TransferRequest>(arena.arena()), 1);
  EXPECT_EQ(arena.arena()->SpaceAllocated(), RequestArena::kFirstBlock);
  arena.Reset();
  EXPECT_EQ(arena.kept_block(), RequestArena::kFirstBlock);

  // 4096 ops take blocks past the first; after Reset the kept block holds them all.
  FillBatch(Arena::CreateMessage<ferry::v1::TransferRequest>(arena.arena()), 4096);
  const uint64_t took = arena.arena()->SpaceAllocated();
  ASSERT_GT(took, RequestArena::kFirstBlock);
  arena.Reset();
  EXPECT_GE(arena.kept_block(), took);
  EXPECT_LE(arena.kept_block(), RequestArena::kMaxKeptBlock);
  for (int round = 0; round < 3; ++round) {
    auto* again = Arena::CreateMessage<ferry::v1::TransferRequest>(arena.arena());
    FillBatch(again, 4096);
    EXPECT_EQ(again->submit().ops_size(), 4096);
    EXPECT_EQ(again->submit().ops(4095).remote_offset(), uint64_t{4096} * 4095);
    EXPECT_EQ(arena.arena()->SpaceAllocated(), arena.kept_block())
        << "a repeat of the batch took a block past the kept one (round " << round << ")";
    arena.Reset();
  }
  // A smaller request after it does not shrink the block (the next batch fits again).
  const size_t kept = arena.kept_block();
  FillBatch(Arena::CreateMessage<ferry::v1::TransferRequest>(arena.arena()), 1);
  arena.Reset();
  EXPECT_EQ(arena.kept_block(), kept);
}

TEST(RequestArenaTest, TheKeptBlockStopsAtItsCap) {
  RequestArena arena;
  // Ops enough to take well over kMaxKeptBlock.
  FillBatch(Arena::CreateMessage<ferry::v1::TransferRequest>(arena.arena()), 65536);
  ASSERT_GT(arena.arena()->SpaceAllocated(), RequestArena::kMaxKeptBlock);
  arena.Reset();
  EXPECT_EQ(arena.kept_block(), RequestArena::kMaxKeptBlock);
  auto* again = Arena::CreateMessage<ferry::v1::TransferRequest>(arena.arena());
  FillBatch(again, 65536);  // still parses; the blocks past the cap go at Reset
  EXPECT_EQ(again->submit().ops_size(), 65536);
  arena.Reset();
  EXPECT_EQ(arena.kept_block(), RequestArena::kMaxKeptBlock);
}

TEST(TransferMessagesTest, DoneCallsArenasAreKeptUpToTheirBoundAndHandedOutEmpty) {
  TransferMessages messages;
  std::vector<grpc::MessageHolder<ferry::v1::TransferRequest, ferry::v1::TransferResult>*> calls;
  for (size_t i = 0; i < TransferMessages::kKeptArenas + 3; ++i) {
    auto* holder = messages.AllocateMessages();
    ASSERT_NE(holder->request(), nullptr);
    ASSERT_NE(holder->response(), nullptr);
    EXPECT_EQ(holder->request()->GetArena(), holder->response()->GetArena());
    FillBatch(holder->request(), 64);
    holder->response()->set_transfer_id(i + 1);
    calls.push_back(holder);
  }
  EXPECT_EQ(messages.kept(), 0u);
  for (auto* holder : calls) holder->Release();
  EXPECT_EQ(messages.kept(), TransferMessages::kKeptArenas);

  for (size_t i = 0; i < TransferMessages::kKeptArenas; ++i) {
    auto* reused = messages.AllocateMessages();
    EXPECT_EQ(reused->request()->submit().ops_size(), 0) << "a kept arena kept its request";
    EXPECT_EQ(reused->response()->transfer_id(), 0u) << "a kept arena kept its result";
    calls[i] = reused;
  }
  EXPECT_EQ(messages.kept(), 0u);
  for (size_t i = 0; i < TransferMessages::kKeptArenas; ++i) calls[i]->Release();
}

}  // namespace
}  // namespace ferry::server
