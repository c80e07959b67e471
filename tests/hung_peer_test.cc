// Issue 44 row 6: a peer that stops answering (SIGSTOP: any hung node, no attacker needed)
// blocks only the transfers to it. Transfers that must first ask a peer something (resolve
// its buffer) start on starter threads in one lane per peer; 40 transfers to the stopped
// node (more than the 32 starters) hold its lane's two threads and wait in it, and a 100-op
// batch to a healthy node starts at once (before: 16 transfers took all 8 shared starters,
// and the batch took 58.9 s; more threads alone would only move the number). Then the
// accounting of all three agents returns to zero.

#include <signal.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/stop_process.h"

namespace ferry {
namespace {

TEST(HungPeerTest, TransfersToAStoppedPeerHoldOnlyItsLaneAndAHealthyPeersBatchGoesOn) {
  const std::string dir = MakeTempDir();
  auto pa = PickFreePort(), pb = PickFreePort(), pc = PickFreePort();
  ASSERT_TRUE(pa.ok() && pb.ok() && pc.ok());
  auto address = [](uint16_t port) { return absl::StrFormat("127.0.0.1:%d", port); };
  auto a = AgentProcess::Start(
      {"node-a", dir, *pa, {{"node-b", address(*pb)}, {"node-c", address(*pc)}}, ""});
  auto b = AgentProcess::Start({"node-b", dir, *pb, {{"node-a", address(*pa)}}, ""});
  auto c = AgentProcess::Start({"node-c", dir, *pc, {{"node-a", address(*pa)}}, ""});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto ca = Client::Connect((*a)->socket());
  auto cb = Client::Connect((*b)->socket());
  auto cc = Client::Connect((*c)->socket());
  ASSERT_TRUE(ca.ok() && cb.ok() && cc.ok());
  auto source = (*ca)->Alloc(1 << 20);
  auto healthy = (*cb)->Alloc(1 << 20, "healthy");
  std::vector<std::unique_ptr<Buffer>> hung_targets;
  constexpr int kHung = 40;
  for (int i = 0; i < kHung; ++i) {
    auto t = (*cc)->Alloc(4096, absl::StrCat("hung-", i));
    ASSERT_TRUE(t.ok()) << t.status();
    hung_targets.push_back(*std::move(t));
  }
  ASSERT_TRUE(source.ok() && healthy.ok());
  std::memset((*source)->data(), 'q', 1 << 20);

  StopProcess((*c)->pid());
  // Transfers to the stopped node, each naming a buffer node-a has not resolved yet.
  std::atomic<int> hung_done{0};
  std::vector<std::thread> hung;
  for (int i = 0; i < kHung; ++i) {
    hung.emplace_back([&, i] {
      (*ca)->Run({{ferry::v1::WRITE, (*source)->id(), 0, "node-c", absl::StrCat("hung-", i), 0,
                   4096}},
                 absl::Seconds(6));
      ++hung_done;
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // they are waiting in node-c's lane by now
  std::vector<OpSpec> batch;
  for (uint64_t i = 0; i < 100; ++i) {
    batch.push_back({ferry::v1::WRITE, (*source)->id(), i * 4096, "node-b", "healthy", i * 4096,
                     4096});
  }
  const absl::Time start = absl::Now();
  auto result = (*ca)->Run(batch, absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->state(), ferry::v1::SUCCEEDED) << result->message();
  EXPECT_LT(took, absl::Seconds(3)) << "a healthy peer's batch waited behind a hung one";
  EXPECT_EQ(hung_done.load(), 0) << "the stopped node answered";
  std::printf("a 100-op batch to a healthy peer took %s beside %d transfers to a stopped one\n",
              absl::FormatDuration(took).c_str(), kHung);
  EXPECT_EQ(std::memcmp((*healthy)->data() + 99 * 4096, (*source)->data() + 99 * 4096, 4096), 0);

  kill((*c)->pid(), SIGCONT);
  for (auto& t : hung) t.join();
  hung_targets.clear();
  source->reset();
  healthy->reset();
  ca->reset();
  cb->reset();
  cc->reset();
  for (auto* agent : {a->get(), b->get(), c->get()}) {
    ExpectAccountingAtZero(agent->socket(), agent->node());
    agent->Stop();
  }
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ferry
