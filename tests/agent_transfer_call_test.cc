// Agent.Transfer between two real agents, as the callback call it is: calls at once from
// more clients than the agent keeps arenas for, with batches of every size, each move their
// own bytes and answer their own result; a call whose client gives up ends while its transfer
// runs on to the end, and the agent serves on. Tearing the pair down checks the accounting.

#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/ferry_client.h"
#include "gtest/gtest.h"
#include "server/api/unary_transfer.h"
#include "tests/agent_pair.h"

namespace ferry {
namespace {

constexpr uint64_t kBlock = 4096;

class AgentTransferCallTest : public SharedPairTest<AgentTransferCallTest> {
 public:
  static constexpr char kYaml[] = "host_pool:\n  size: 256MiB\n";
};

// 12 clients (more than the agent's kept arenas), each 24 calls alternating one op and 512
// scattered ops into a region of its own: each answer counts its own call's bytes (an arena
// handed on with its last request would not), and every block is where its op put it.
TEST_F(AgentTransferCallTest, CallsAtOnceWithBatchesOfEverySizeEachMoveTheirOwn) {
  constexpr int kClients = 12;
  static_assert(kClients > server::TransferMessages::kKeptArenas);
  constexpr int kCalls = 24;
  constexpr uint64_t kRegion = 512 * kBlock;
  auto src = A().Alloc(kClients * kRegion);
  auto dst = B().Alloc(kClients * kRegion, "every-size");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill(**src, 17);
  std::memset((*dst)->data(), 0, kClients * kRegion);
  const uint64_t src_id = (*src)->id();
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto client = Client::Connect(pair_->a->socket());
      ASSERT_TRUE(client.ok()) << client.status();
      const uint64_t base = c * kRegion;
      for (int call = 0; call < kCalls; ++call) {
        std::vector<OpSpec> ops;
        const int blocks = call % 2 == 0 ? 1 : 512;
        for (int i = 0; i < blocks; ++i) {
          // Block i of the region lands at slot (i * 5) % 512: scattered, each slot once.
          const uint64_t to = base + ((i * 5) % 512) * kBlock;
          ops.push_back({ferry::v1::WRITE, src_id, to, "node-b", "every-size", to, kBlock});
        }
        auto result = (*client)->Run(ops);
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ(result->state(), ferry::v1::SUCCEEDED) << result->message();
        EXPECT_EQ(result->bytes(), blocks * kBlock) << "client " << c << ", call " << call;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(std::memcmp((*src)->data(), (*dst)->data(), kClients * kRegion), 0);
  EXPECT_TRUE(A().Free(src_id).ok());
  EXPECT_TRUE(B().Free((*dst)->id()).ok());
}

// A call with a 100 ms deadline for 2 GiB: the client hears DEADLINE_EXCEEDED, the transfer
// runs on to the end (its own timeout is the request's), and the agent serves on.
TEST_F(AgentTransferCallTest, ACallWhoseClientGivesUpEndsWhileItsTransferRunsOn) {
  constexpr uint64_t kOp = 16 << 20;
  constexpr int kOps = 128;
  auto src = A().Alloc(kOp);
  auto dst = B().Alloc(kOp, "given-up");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill(**src, 23);
  ferry::v1::TransferRequest req;
  for (int i = 0; i < kOps; ++i) {
    ferry::v1::Op* op = req.mutable_submit()->add_ops();
    op->set_type(ferry::v1::WRITE);
    op->set_local_buffer((*src)->id());
    op->set_peer("node-b");
    op->set_remote_buffer("given-up");
    op->set_length(kOp);
  }
  req.mutable_submit()->set_timeout_ms(60000);
  // Resolved and kept first, so the call below starts at once on gRPC's thread: its deadline
  // cannot pass before the transfer started, however slow the machine.
  ASSERT_TRUE(A().Write(**src, 0, "node-b", "given-up", 0, kBlock).ok());
  {
    grpc::ClientContext ctx;
    A().session().Attach(&ctx);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    ferry::v1::TransferResult result;
    grpc::Status s = A().stub().Transfer(&ctx, req, &result);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  }
  // It runs on: listed running, or already finished, and then it ends having moved it all.
  ferry::v1::TransferSummary last;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (absl::Now() < until) {
    grpc::ClientContext ctx;
    ferry::v1::ListTransfersRequest list;
    list.set_recent(1);
    ferry::v1::ListTransfersResponse transfers;
    ASSERT_TRUE(A().stub().ListTransfers(&ctx, list, &transfers).ok());
    if (transfers.running().empty() && !transfers.recent().empty()) {
      last = transfers.recent(0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(last.state(), ferry::v1::SUCCEEDED) << last.message();
  EXPECT_EQ(last.ops_total(), static_cast<uint64_t>(kOps));
  EXPECT_EQ(last.bytes_done(), kOps * kOp);
  EXPECT_EQ(std::memcmp((*src)->data(), (*dst)->data(), kOp), 0);
  // And the agent serves on.
  EXPECT_TRUE(A().Write(**src, 0, "node-b", "given-up", 0, kBlock).ok());
  EXPECT_TRUE(A().Free((*src)->id()).ok());
  EXPECT_TRUE(B().Free((*dst)->id()).ok());
}

}  // namespace
}  // namespace ferry
