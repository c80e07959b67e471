// Kept ResolveBlocks answers with two real agents: node-a moves blocks into node-b's
// exported list "kv" and, after the first move, asks node-b nothing (ListPeers: kept_lists
// on node-a, lists_held and lists_granted on node-b). The answer goes before a move could
// reach the wrong blocks: node-b releasing the list (Release returns once node-a dropped it,
// and the name prepared again over other blocks is what node-a reaches then), freeing a
// buffer the list lies in, or its session ending; a move refused on a kept answer drops
// it. (A node-b that does not know node-a lets it keep nothing: agent_kept_answers_test.)
// Moves with wait run over the gRPC call and over the transfer socket, which takes the
// session each move names and checks it.

#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/block_client.h"
#include "client/ferry_client.h"
#include "client/socket_line.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/socket_clients.h"

namespace ferry {
namespace {

constexpr uint64_t kBlock = 16 << 10;
constexpr uint64_t kBlocks = 8;  // per buffer

class AgentKeptListsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pair_.Start().ok());
    a_blocks_ = std::make_unique<BlockClient>(pair_.ca->shared_session());
    b_blocks_ = std::make_unique<BlockClient>(pair_.cb->shared_session());
    auto src = pair_.ca->Alloc(kBlocks * kBlock);
    auto k = pair_.cb->Alloc(kBlocks * kBlock, "k");
    auto v = pair_.cb->Alloc(kBlocks * kBlock, "v");
    ASSERT_TRUE(src.ok() && k.ok() && v.ok());
    src_ = std::move(*src);
    k_ = std::move(*k);
    v_ = std::move(*v);
    Fill(*src_, 1);
    auto local = a_blocks_->Prepare({Extent(src_->id(), 0, kBlock, kBlocks)});
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = local->list();
    ASSERT_NO_FATAL_FAILURE(Export({k_.get(), v_.get()}));
  }
  // node-b exports "kv": `buffers`' blocks, one buffer after the other.
  void Export(const std::vector<Buffer*>& buffers) {
    std::vector<ferry::v1::BlockExtent> extents;
    for (Buffer* b : buffers) extents.push_back(Extent(b->id(), 0, kBlock, kBlocks));
    auto exported = b_blocks_->Prepare(extents, "kv");
    ASSERT_TRUE(exported.ok()) << exported.status();
    exported_ = exported->list();
  }
  // node-a's block `from` into block `to` of node-b's `list`; the transfer's status.
  absl::Status Push(uint64_t from, uint64_t to, const std::string& list = "kv") {
    auto moved = a_blocks_->Move(ferry::v1::WRITE, local_, {from}, "node-b", list, {to});
    if (!moved.ok()) return moved.status();
    auto r = pair_.ca->Wait(moved->transfer_id(), absl::Seconds(30));
    return r.ok() ? TransferStatus(*r) : r.status();
  }
  bool Holds(const Buffer& b, uint64_t block, uint64_t src_block) const {
    return std::memcmp(b.data() + block * kBlock, src_->data() + src_block * kBlock, kBlock) == 0;
  }
  // 8 threads, 16 moves with wait each through `blocks`: thread t owns k's block t (and
  // with an odd t v's block t too: 1 or 2 pairs a move). Each answer is its own move's, the
  // ids are distinct, and the last move of each thread is what its blocks hold.
  void MovesAtOnce(BlockClient& blocks) {
    constexpr int kCallers = 8, kMoves = 16;
    std::vector<std::string> failures(kCallers);
    std::vector<std::vector<uint64_t>> ids(kCallers);
    std::vector<std::thread> callers;
    for (int t = 0; t < kCallers; ++t) {
      callers.emplace_back([&, t] {
        std::vector<uint64_t> to = {static_cast<uint64_t>(t)};
        if (t % 2 == 1) to.push_back(kBlocks + t);
        for (int i = 0; i < kMoves && failures[t].empty(); ++i) {
          const uint64_t from = (t + i) % kBlocks;
          std::vector<uint64_t> froms(to.size(), from);
          auto moved = blocks.Move(ferry::v1::WRITE, local_, froms, "node-b", "kv", to, "", 0,
                                   false, /*wait=*/true);
          if (!moved.ok()) {
            failures[t] = moved.status().ToString();
          } else if (moved->result().state() != ferry::v1::SUCCEEDED ||
                     moved->result().transfer_id() != moved->transfer_id() ||
                     moved->result().bytes() != to.size() * kBlock ||
                     moved->bytes() != to.size() * kBlock) {
            failures[t] = moved->DebugString();
          }
          if (moved.ok()) ids[t].push_back(moved->transfer_id());
        }
      });
    }
    for (auto& c : callers) c.join();
    std::set<uint64_t> distinct;
    for (int t = 0; t < kCallers; ++t) {
      EXPECT_EQ(failures[t], "") << "caller " << t;
      distinct.insert(ids[t].begin(), ids[t].end());
      // The last move of caller t wrote source block (t + kMoves - 1) % kBlocks.
      const uint64_t last = (t + kMoves - 1) % kBlocks;
      EXPECT_TRUE(Holds(*k_, t, last)) << "caller " << t;
      if (t % 2 == 1) {
        EXPECT_TRUE(Holds(*v_, t, last)) << "caller " << t;
      }
    }
    EXPECT_EQ(distinct.size(), static_cast<size_t>(kCallers * kMoves));
  }
  // A WRITE of our block `from` into block `to` of node-b's "kv", as a raw request.
  ferry::v1::MoveBlocksRequest OnePair(uint64_t from, uint64_t to) const {
    ferry::v1::MoveBlocksRequest req;
    req.set_type(ferry::v1::WRITE);
    req.set_list(local_);
    req.set_peer("node-b");
    req.set_remote_list("kv");
    req.add_local_blocks(from);
    req.add_remote_blocks(to);
    return req;
  }
  ferry::v1::PeerInfo AOfB() { return PeerOf(*pair_.ca, "node-b"); }
  ferry::v1::PeerInfo BOfA() { return PeerOf(*pair_.cb, "node-a"); }

  Pair pair_;  // first: the clients and buffers below go before it checks the accounting
  std::unique_ptr<BlockClient> a_blocks_, b_blocks_;
  std::unique_ptr<Buffer> src_, k_, v_;
  uint64_t local_ = 0, exported_ = 0;
};

TEST_F(AgentKeptListsTest, TheSecondMoveToAListAsksThePeerNothing) {
  EXPECT_EQ(AOfB().kept_lists(), 0u);
  ASSERT_TRUE(Push(0, 0).ok());
  EXPECT_EQ(AOfB().kept_lists(), 1u);
  EXPECT_EQ(BOfA().lists_held(), 1u);
  EXPECT_EQ(BOfA().lists_granted(), 1u);
  ASSERT_TRUE(Push(1, kBlocks + 1).ok());  // into v
  ASSERT_TRUE(Push(2, 2).ok());
  // Every ResolveBlocks node-a makes is granted: still one, so the moves after the first
  // asked node-b nothing; and they landed where the list says.
  EXPECT_EQ(BOfA().lists_granted(), 1u);
  EXPECT_TRUE(Holds(*k_, 0, 0));
  EXPECT_TRUE(Holds(*v_, 1, 1));
  EXPECT_TRUE(Holds(*k_, 2, 2));
}

// MoveBlocks with `wait` answers without a waiting thread, over the gRPC call (a callback
// call) and over the transfer socket: one on a kept answer starts on the thread that read
// it, and the transfer's end answers it (it may end before the start returned). Eight
// clients' moves at once, each of its own size, are each answered with their own transfer's
// result; over the socket they share the client's connection, which the agent counts.
TEST_F(AgentKeptListsTest, MovesWithWaitAtOnceAreEachAnsweredWithTheirOwnResult) {
  ASSERT_TRUE(Push(0, 0).ok());  // the answer kept: the moves below ask node-b nothing
  BlockClient on_socket(pair_.ca.get());
  for (BlockClient* blocks : {a_blocks_.get(), &on_socket}) {
    SCOPED_TRACE(blocks == &on_socket ? "transfer socket" : "gRPC call");
    ASSERT_NO_FATAL_FAILURE(MovesAtOnce(*blocks));
    EXPECT_EQ(SocketClients(*pair_.ca), blocks == &on_socket ? 1u : 0u);
  }
  EXPECT_EQ(BOfA().lists_granted(), 1u);  // asked once, before them
}

// Lists belong to a session: a call outside one is refused before anything starts.
TEST_F(AgentKeptListsTest, AMoveOutsideASessionIsRefusedSayingSo) {
  ferry::v1::MoveBlocksRequest req = OnePair(0, 0);
  req.set_wait(true);
  auto stub = ferry::v1::Tensors::NewStub(pair_.ca->shared_session()->channel());
  grpc::ClientContext ctx;  // not attached to the session
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  ferry::v1::MoveBlocksResponse resp;
  grpc::Status s = stub->MoveBlocks(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("ferry-session"), std::string::npos) << s.error_message();
  EXPECT_EQ(BOfA().lists_granted(), 0u);  // node-b was not asked
}

// Over the transfer socket the move names its session itself: none (0), one that is not
// open, and another open session of the same uid (whose lists ours are not) are refused,
// saying which; nothing reaches node-b. Ours moves.
TEST_F(AgentKeptListsTest, AMoveOnTheTransferSocketMovesInTheSessionItNames) {
  auto info = pair_.ca->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->transfer_socket_moves());  // what tells libferry to send moves there
  auto line = SocketLine::Connect(info->transfer_socket());
  ASSERT_TRUE(line.ok()) << line.status();
  const ferry::v1::MoveBlocksRequest req = OnePair(3, 5);
  auto other = Client::Connect(pair_.a->socket());
  ASSERT_TRUE(other.ok()) << other.status();
  struct Case {
    uint64_t session;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {0, absl::StatusCode::kFailedPrecondition, "move.session: block lists belong to a session"},
      {(*other)->session().id() + 1000, absl::StatusCode::kFailedPrecondition, "is not open"},
      {(*other)->session().id(), absl::StatusCode::kNotFound, "does not exist in this session"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.session);
    SocketLine::Outcome outcome = (*line)->Move(c.session, req, absl::Seconds(20));
    EXPECT_TRUE(outcome.sent);
    EXPECT_EQ(outcome.result.status().code(), c.code) << outcome.result.status();
    EXPECT_NE(outcome.result.status().message().find(c.message), std::string::npos)
        << outcome.result.status();
  }
  EXPECT_EQ(BOfA().lists_granted(), 0u);  // node-b was not asked
  SocketLine::Outcome ours = (*line)->Move(pair_.ca->session().id(), req, absl::Seconds(20));
  ASSERT_TRUE(ours.result.ok()) << ours.result.status();
  EXPECT_EQ(ours.result->state(), ferry::v1::SUCCEEDED);
  EXPECT_EQ(ours.result->bytes_total(), kBlock);
  EXPECT_TRUE(Holds(*k_, 5, 3));
  line->reset();
  other->reset();
  ExpectSocketClients(*pair_.ca, 0);
}

TEST_F(AgentKeptListsTest, AMoveRefusedOnTheKeptAnswerAsksAgainNextTime) {
  ASSERT_TRUE(Push(0, 0).ok());
  ASSERT_EQ(AOfB().kept_lists(), 1u);
  // Out of the kept answer's range: maybe the answer is what is wrong, so it goes.
  absl::Status refused = Push(0, 2 * kBlocks);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(AOfB().kept_lists(), 0u);
  ASSERT_TRUE(Push(1, 1).ok());
  EXPECT_EQ(AOfB().kept_lists(), 1u);
  EXPECT_EQ(BOfA().lists_granted(), 2u);
}

TEST_F(AgentKeptListsTest, ReleasingTheListRevokesItBeforeReleaseReturns) {
  ASSERT_TRUE(Push(0, 0).ok());
  ASSERT_EQ(AOfB().kept_lists(), 1u);
  ASSERT_TRUE(b_blocks_->Release(exported_).ok());
  // No polling: Release returned after node-a confirmed.
  EXPECT_EQ(AOfB().kept_lists(), 0u);
  EXPECT_EQ(BOfA().lists_held(), 0u);
  absl::Status gone = Push(0, 0);
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;

  // The name again over the blocks the other way round: block 0 is v's first now, and a
  // move there lands in v, not where the old answer said.
  ASSERT_NO_FATAL_FAILURE(Export({v_.get(), k_.get()}));
  ASSERT_TRUE(Push(3, 0).ok());
  EXPECT_TRUE(Holds(*v_, 0, 3));
  EXPECT_TRUE(Holds(*k_, 0, 0));  // the first push, untouched
  EXPECT_EQ(BOfA().lists_granted(), 2u);
}

TEST_F(AgentKeptListsTest, FreeingABufferOfTheListDropsItsAnswer) {
  ASSERT_TRUE(Push(0, kBlocks).ok());
  ASSERT_EQ(AOfB().kept_lists(), 1u);
  ASSERT_TRUE(pair_.cb->Free(v_->id()).ok());
  v_.reset();
  EXPECT_EQ(AOfB().kept_lists(), 0u);
  // node-b no longer answers for a list whose buffer is gone, as for one that is not there.
  absl::Status gone = Push(0, 0);
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
}

TEST_F(AgentKeptListsTest, ASessionEndingRevokesItsLists) {
  // Another session's list over a buffer that outlives every session, so that only the
  // list's own release (not a buffer freed with the session) can take the answer away.
  auto kept = pair_.cb->Alloc(kBlocks * kBlock, "outlives", "host", /*persist=*/true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  const uint64_t kept_id = (*kept)->id();
  {
    auto owner = Client::Connect(pair_.b->socket());
    ASSERT_TRUE(owner.ok());
    BlockClient owner_blocks((*owner)->shared_session());
    ASSERT_TRUE(owner_blocks.Prepare({Extent(kept_id, 0, kBlock, kBlocks)}, "owned").ok());
    ASSERT_TRUE(Push(0, 5, "owned").ok());
    ASSERT_EQ(AOfB().kept_lists(), 1u);
  }  // node-b releases the session's lists once it sees the client gone
  absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (AOfB().kept_lists() != 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(AOfB().kept_lists(), 0u);
  EXPECT_EQ(BOfA().lists_held(), 0u);
  absl::Status gone = Push(0, 5, "owned");
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  EXPECT_TRUE(Holds(**kept, 5, 0));  // the one move that was allowed
  kept->reset();
  ASSERT_TRUE(pair_.cb->Free(kept_id).ok());
}

TEST_F(AgentKeptListsTest, AListAskedOfARestartedPeerIsNotFoundSayingItRestarted) {
  ASSERT_TRUE(Push(0, 0).ok());  // node-a keeps node-b's answer for "kv"
  // node-b dies and a new run takes its socket and port. Its old client lives on.
  std::unique_ptr<Client> old = std::move(pair_.cb);
  const uint64_t old_session = old->session().id();
  b_blocks_.reset();
  k_.reset();
  v_.reset();
  pair_.b->Kill();
  ASSERT_TRUE(pair_.StartB().ok());
  EXPECT_NE(pair_.cb->session().id(), old_session);
  // Before, the first list asked of the new run said only "no block list named 'kv'".
  absl::Status gone = Push(0, 0);
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  EXPECT_THAT(std::string(gone.message()),
              ::testing::AllOf(::testing::MatchesRegex(".*node-b restarted [0-9]+ s ago.*"),
                               ::testing::HasSubstr("no block list named 'kv'")));
  // The old client's session is not the new run's: it cannot allocate into a session a
  // new client opened (ids once restarted at 1 in every run), nor see the old one alive.
  EXPECT_FALSE(old->session().alive());
  auto stray = old->Alloc(4096);
  EXPECT_FALSE(stray.ok());
  EXPECT_THAT(std::string(stray.status().message()), ::testing::HasSubstr("not open"));
}

TEST_F(AgentKeptListsTest, NoIdAnEarlierRunHandedOutNamesWhatTheNewRunsClientsMake) {
  // node-b's first run hands out buffers (k, v) and a transfer (k's first bytes into v,
  // node-b to itself).
  const std::set<uint64_t> old_buffers = {k_->id(), v_->id()};
  auto old_transfer =
      pair_.cb->Submit({{ferry::v1::WRITE, k_->id(), 0, "node-b", "v", 0, 4096}});
  ASSERT_TRUE(old_transfer.ok()) << old_transfer.status();
  ASSERT_TRUE(pair_.cb->Wait(*old_transfer, absl::Seconds(20)).ok());
  b_blocks_.reset();
  k_.reset();
  v_.reset();
  pair_.b->Kill();
  ASSERT_TRUE(pair_.StartB().ok());
  // The new run's clients make buffers and a transfer. Before, ids counted from 1 in every
  // run: these were k's and v's ids again and transfer 1 again, so a client of the old run
  // still naming its ids wrote into, waited for or cancelled a new client's.
  std::vector<std::unique_ptr<Buffer>> fresh;
  for (int i = 0; i < 4; ++i) {
    auto b = pair_.cb->Alloc(4096, i == 0 ? "landing" : "");
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_FALSE(old_buffers.contains((*b)->id())) << "buffer " << (*b)->id();
    fresh.push_back(std::move(*b));
  }
  auto transfer =
      pair_.cb->Submit({{ferry::v1::WRITE, fresh[1]->id(), 0, "node-b", "landing", 0, 4096}});
  ASSERT_TRUE(transfer.ok()) << transfer.status();
  EXPECT_NE(*transfer, *old_transfer);
  // An old id names nothing in the new run.
  for (uint64_t id : old_buffers) {
    absl::Status freed = pair_.cb->Free(id);
    EXPECT_EQ(freed.code(), absl::StatusCode::kNotFound) << freed;
    EXPECT_THAT(std::string(freed.message()), ::testing::HasSubstr("does not exist"));
  }
  auto waited = pair_.cb->Wait(*old_transfer, absl::Seconds(1));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kNotFound) << waited.status();
  for (const auto& b : fresh) EXPECT_TRUE(pair_.cb->Free(b->id()).ok());
}

}  // namespace
}  // namespace ferry
