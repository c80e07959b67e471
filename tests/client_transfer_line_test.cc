// Client::Run of small batches over the client's shared transfer line (client/transfer_line.h)
// between two real agents: threads sharing a client each get their own answers, refusals
// included; a caller whose agent stopped answering gets DEADLINE_EXCEEDED at its own
// deadline while the line lives on; an agent that died gives UNAVAILABLE, not a hang.

#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "client/ferry_client.h"
#include "client/transfer_line.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/shared_line_check.h"
#include "tests/stop_process.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBlock = 4096;
constexpr absl::Duration kTimeout = absl::Seconds(60);

// Runs `run` while `pid` is stopped (StopProcess, then SIGCONT); how long `run` took.
template <typename Run>
absl::Duration WhileStopped(pid_t pid, Run run) {
  StopProcess(pid);
  const absl::Time start = absl::Now();
  run();
  const absl::Duration took = absl::Now() - start;
  kill(pid, SIGCONT);
  return took;
}

// Two agents, a 1 MiB source on node-a, a target on node-b named `target`, and one 4 KiB
// WRITE from the one to the other.
struct OneBlockPair {
  Pair pair;
  std::unique_ptr<Buffer> src, dst;
  OpSpec op;

  absl::Status Start(const std::string& target) {
    RETURN_IF_ERROR(pair.Start());
    auto s = pair.ca->Alloc(1 << 20);
    auto d = pair.cb->Alloc(1 << 20, target);
    if (!s.ok()) return s.status();
    if (!d.ok()) return d.status();
    src = *std::move(s);
    dst = *std::move(d);
    op = {ferry::v1::WRITE, src->id(), 0, "node-b", target, 0, kBlock};
    return absl::OkStatus();
  }
};

// A line of `client`'s own (not the one Client::Run uses, so no fallback hides a fault).
std::unique_ptr<TransferLine> OpenLine(Client& client) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  client.session().Attach(ctx.get());
  return std::make_unique<TransferLine>(client.stub(), std::move(ctx));
}

// 6 threads on one line, 150 one-block WRITEs each (tests/shared_line_check.h).
TEST(ClientTransferLineTest, ThreadsSharingAClientEachGetTheirOwnAnswer) {
  Pair pair;
  ASSERT_TRUE(pair.Start("host_pool:\n  size: 256MiB\n").ok());
  auto line = OpenLine(*pair.ca);
  ExpectThreadsGetTheirOwnAnswers(pair, 6, 150, [&](const std::vector<OpSpec>& ops) {
    return line->Run(ops, kTimeout, false, kTimeout);
  });
  EXPECT_FALSE(line->ended());
}

// An agent that stops answering (SIGSTOP): the caller gets DEADLINE_EXCEEDED once its
// transfer's timeout and the 5 s grace have passed, not later; once the agent runs again
// the same client's next Run goes through (the late answer is dropped).
TEST(ClientTransferLineTest, ACallerGetsDeadlineExceededAtItsOwnDeadlineAndTheLineLivesOn) {
  OneBlockPair p;
  ASSERT_TRUE(p.Start("paused").ok());
  auto line = OpenLine(*p.pair.ca);
  ASSERT_TRUE(line->Run({p.op}, kTimeout, false, kTimeout).result.ok());
  TransferLine::Outcome stalled;
  const absl::Duration took = WhileStopped(p.pair.a->pid(), [&] {
    // What Client::Run waits for a 1 s transfer: 6 s.
    stalled = line->Run({p.op}, absl::Seconds(1), false, absl::Seconds(6));
  });
  EXPECT_EQ(stalled.result.status().code(), absl::StatusCode::kDeadlineExceeded)
      << stalled.result.status();
  EXPECT_TRUE(stalled.sent);
  EXPECT_GE(took, absl::Seconds(6));
  EXPECT_LT(took, absl::Seconds(20));
  TransferLine::Outcome after = line->Run({p.op}, kTimeout, false, kTimeout);
  ASSERT_TRUE(after.result.ok()) << after.result.status();
  EXPECT_TRUE(TransferStatus(*after.result).ok());
  EXPECT_FALSE(line->ended());
  // Client::Run's own line says the same.
  absl::Status through_client;
  const absl::Duration took_client = WhileStopped(p.pair.a->pid(), [&] {
    through_client = p.pair.ca->Run({p.op}, absl::Seconds(1)).status();
  });
  EXPECT_GE(took_client, absl::Seconds(6));
  // Not GetInfo's 30 s first: the client asks the stopped agent for its transfer socket for
  // a second at most, then takes the gRPC line.
  EXPECT_LT(took_client, absl::Seconds(15));
  EXPECT_EQ(through_client.code(), absl::StatusCode::kDeadlineExceeded) << through_client;
}

// An agent that died: Run answers UNAVAILABLE at once (the line ended; the call of its own
// it falls back to cannot connect), not at its deadline.
TEST(ClientTransferLineTest, AnAgentThatDiedGivesUnavailableNotAHang) {
  OneBlockPair p;
  ASSERT_TRUE(p.Start("gone").ok());
  auto line = OpenLine(*p.pair.ca);
  ASSERT_TRUE(line->Run({p.op}, kTimeout, false, kTimeout).result.ok());
  ASSERT_TRUE(p.pair.ca->Run({p.op}).ok());
  p.pair.a->Kill();
  const absl::Time start = absl::Now();
  auto result = p.pair.ca->Run({p.op}, absl::Seconds(30));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  TransferLine::Outcome on_line =
      line->Run({p.op}, absl::Seconds(30), false, absl::Seconds(35));
  EXPECT_EQ(on_line.result.status().code(), absl::StatusCode::kUnavailable)
      << on_line.result.status();
  EXPECT_TRUE(line->ended());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

}  // namespace
}  // namespace ferry
