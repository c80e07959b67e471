// Rails between two real agents (DESIGN.md, "Rails"): each runs the 8-GPU / 8-NIC switch
// fixture with simulated GPUs and one tcp rail per NIC on its own loopback address
// (node-a on 127.0.10.x, node-b on 127.0.20.x; NIC i on .i+1), the host pool bound to NUMA
// node 0 (mlx5_0..3). What the per-NIC counters of both agents say is asserted, not only
// that bytes arrived.

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr uint64_t kMiB = 1 << 20;
constexpr int kNics = 8;

std::string RailsYaml(int subnet) {
  std::string yaml = absl::StrCat("topology: ", FERRY_FIXTURES,
                                  "/topology/dgx8_switches.xml\n"
                                  "providers: [tcp]\n"
                                  "host_pool:\n  size: 1GiB\n  numa: 0\n"
                                  "gpu:\n  backend: sim\n  count: 8\n  pool_size: 64MiB\n"
                                  "tcp:\n  connections: 2\n  rails:\n");
  for (int n = 0; n < kNics; ++n) {
    absl::StrAppend(&yaml, "    mlx5_", n, ": 127.0.", subnet, ".", n + 1, "\n");
  }
  return yaml;
}

std::string Rail(int nic) { return absl::StrCat("tcp:mlx5_", nic); }

// Per rail: bytes we sent to `peer` through it, and bytes peers wrote into us through it.
struct NicCounts {
  std::map<std::string, uint64_t> sent;
  std::map<std::string, uint64_t> served;
  std::map<std::string, ferry::v1::NicPeerInfo> to_peer;
  std::map<std::string, std::string> health;
};

NicCounts Counts(Client& client, const std::string& peer) {
  NicCounts out;
  auto info = client.GetInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return out;
  for (const auto& nic : info->nics()) {
    out.served[nic.rail()] = nic.served_written_bytes();
    out.health[nic.rail()] = nic.health();
    out.sent[nic.rail()] = 0;
    for (const auto& p : nic.peers()) {
      if (p.peer() != peer) continue;
      out.sent[nic.rail()] = p.bytes();
      out.to_peer[nic.rail()] = p;
    }
  }
  return out;
}

// after - before, rail by rail.
std::map<std::string, uint64_t> Delta(const std::map<std::string, uint64_t>& before,
                                      const std::map<std::string, uint64_t>& after) {
  std::map<std::string, uint64_t> out;
  for (const auto& [rail, bytes] : after) {
    auto it = before.find(rail);
    out[rail] = bytes - (it == before.end() ? 0 : it->second);
  }
  return out;
}

std::vector<std::string> Rails(const ferry::v1::Leg& leg) {
  return {leg.rails().begin(), leg.rails().end()};
}

class AgentRailsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status s = pair_.Start(RailsYaml(10), RailsYaml(20));
    ASSERT_TRUE(s.ok()) << s;
  }

  absl::StatusOr<ferry::v1::SetNicStateResponse> SetNic(Client& c, const std::string& nic,
                                                        bool up) {
    ferry::v1::SetNicStateRequest req;
    req.set_nic(nic);
    req.set_up(up);
    req.set_reason("failover test");
    ferry::v1::SetNicStateResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = c.stub().SetNicState(&ctx, req, &resp);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                     s.error_message());
    return resp;
  }

  Pair pair_;
};

TEST_F(AgentRailsTest, EveryRailIsItsOwnFabricOnItsOwnAddress) {
  auto info = pair_.ca->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->nics_size(), kNics);
  for (int n = 0; n < kNics; ++n) {
    const auto& nic = info->nics(n);
    EXPECT_EQ(nic.rail(), Rail(n));
    EXPECT_THAT(nic.address(), HasSubstr(absl::StrCat("127.0.10.", n + 1, ":")));
    EXPECT_EQ(nic.health(), "ok");
    EXPECT_EQ(nic.numa(), n < 4 ? 0 : 1);
    EXPECT_THAT(nic.gpus(), ElementsAre(absl::StrCat("cuda:", n)));
    EXPECT_EQ(nic.host(), n < 4) << nic.rail();  // the host pool is on NUMA node 0
  }
}

TEST_F(AgentRailsTest, GpuToSameGpuIsCarriedOnlyByThatGpusNicOnBothSides) {
  constexpr uint64_t kSize = 8 * kMiB;
  for (int g : {0, 3, 5, 7}) {
    SCOPED_TRACE(absl::StrCat("GPU ", g));
    const std::string device = absl::StrCat("cuda:", g);
    auto target = pair_.cb->Alloc(kSize, absl::StrCat("g", g), device);
    ASSERT_TRUE(target.ok()) << target.status();
    auto src = pair_.ca->Alloc(kSize, "", device);
    ASSERT_TRUE(src.ok()) << src.status();
    Fill(**src, 100 + g);
    NicCounts a0 = Counts(*pair_.ca, "node-b"), b0 = Counts(*pair_.cb, "node-a");

    auto r = pair_.ca->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", absl::StrCat("g", g), 0,
                             kSize}},
                           absl::Seconds(30), true);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->ops_size(), 1);
    ASSERT_EQ(r->ops(0).legs_size(), 2);
    EXPECT_EQ(r->ops(0).legs(0).mode(), "gdr");
    EXPECT_EQ(r->ops(0).legs(0).nic(), absl::StrCat("mlx5_", g));
    EXPECT_THAT(Rails(r->ops(0).legs(0)), ElementsAre(Rail(g)));
    EXPECT_THAT(Rails(r->ops(0).legs(1)), ElementsAre(Rail(g)));
    EXPECT_THAT(r->ops(0).retries(), IsEmpty());
    EXPECT_EQ(std::memcmp((*src)->data(), (*target)->data(), kSize), 0);

    // Only NIC g moved bytes, on both sides.
    auto sent = Delta(a0.sent, Counts(*pair_.ca, "node-b").sent);
    auto served = Delta(b0.served, Counts(*pair_.cb, "node-a").served);
    for (int n = 0; n < kNics; ++n) {
      EXPECT_EQ(sent[Rail(n)], n == g ? kSize : 0) << "node-a " << Rail(n);
      EXPECT_EQ(served[Rail(n)], n == g ? kSize : 0) << "node-b " << Rail(n);
    }
    ASSERT_TRUE(pair_.ca->Free((*src)->id()).ok());
    ASSERT_TRUE(pair_.cb->Free((*target)->id()).ok());
  }
}

TEST_F(AgentRailsTest, AStagedGpuLegLeavesThroughItsGpusNicToThePeersGpuNic) {
  // GDR off on both: the bytes go through bounce chunks, still on GPU 2's NIC at both ends.
  ASSERT_TRUE(pair_.ca->SetPolicy({{"gdr", "never"}}).ok());
  ASSERT_TRUE(pair_.cb->SetPolicy({{"gdr", "never"}}).ok());
  constexpr uint64_t kSize = 8 * kMiB;
  auto target = pair_.cb->Alloc(kSize, "g2", "cuda:2");
  ASSERT_TRUE(target.ok()) << target.status();
  auto src = pair_.ca->Alloc(kSize, "", "cuda:2");
  ASSERT_TRUE(src.ok()) << src.status();
  Fill(**src, 21);
  NicCounts a0 = Counts(*pair_.ca, "node-b"), b0 = Counts(*pair_.cb, "node-a");
  auto r = pair_.ca->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "g2", 0, kSize}},
                         absl::Seconds(30), true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ops(0).legs(0).mode(), "staged");
  EXPECT_EQ(r->ops(0).legs(1).mode(), "staged");
  EXPECT_THAT(Rails(r->ops(0).legs(0)), ElementsAre(Rail(2)));
  EXPECT_THAT(Rails(r->ops(0).legs(1)), ElementsAre(Rail(2)));
  EXPECT_EQ(std::memcmp((*src)->data(), (*target)->data(), kSize), 0);
  auto sent = Delta(a0.sent, Counts(*pair_.ca, "node-b").sent);
  auto served = Delta(b0.served, Counts(*pair_.cb, "node-a").served);
  for (int n = 0; n < kNics; ++n) {
    EXPECT_EQ(sent[Rail(n)], n == 2 ? kSize : 0) << "node-a " << Rail(n);
    EXPECT_EQ(served[Rail(n)], n == 2 ? kSize : 0) << "node-b " << Rail(n);
  }
}

TEST_F(AgentRailsTest, AHostTransferIsSplitEvenlyOverTheNicsOfItsNumaNode) {
  constexpr uint64_t kSize = 256 * kMiB;
  auto target = pair_.cb->Alloc(kSize, "landing");
  ASSERT_TRUE(target.ok()) << target.status();
  auto src = pair_.ca->Alloc(kSize);
  ASSERT_TRUE(src.ok()) << src.status();
  Fill(**src, 7);
  NicCounts a0 = Counts(*pair_.ca, "node-b"), b0 = Counts(*pair_.cb, "node-a");

  auto r = pair_.ca->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "landing", 0, kSize}},
                         absl::Seconds(60), true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ops(0).legs(0).mode(), "host");
  EXPECT_THAT(Rails(r->ops(0).legs(0)), ElementsAre(Rail(0), Rail(1), Rail(2), Rail(3)));
  EXPECT_THAT(Rails(r->ops(0).legs(1)), ElementsAre(Rail(0), Rail(1), Rail(2), Rail(3)));
  EXPECT_EQ(std::memcmp((*src)->data(), (*target)->data(), kSize), 0);

  auto sent = Delta(a0.sent, Counts(*pair_.ca, "node-b").sent);
  auto served = Delta(b0.served, Counts(*pair_.cb, "node-a").served);
  const double share = kSize / 4.0;
  for (int n = 0; n < kNics; ++n) {
    if (n < 4) {
      EXPECT_NEAR(static_cast<double>(sent[Rail(n)]), share, share * 0.1) << Rail(n);
      EXPECT_NEAR(static_cast<double>(served[Rail(n)]), share, share * 0.1) << Rail(n);
    } else {
      EXPECT_EQ(sent[Rail(n)], 0u) << Rail(n);  // NUMA node 1's NICs carry no host memory
      EXPECT_EQ(served[Rail(n)], 0u) << Rail(n);
    }
  }
}

TEST_F(AgentRailsTest, ARailThatFailsMidTransferIsRetriedElsewherePausedAndComesBack) {
  constexpr uint64_t kOp = 64 * kMiB;
  constexpr int kOps = 8;
  auto target = pair_.cb->Alloc(kOp * kOps, "landing");
  ASSERT_TRUE(target.ok()) << target.status();
  auto src = pair_.ca->Alloc(kOp * kOps);
  ASSERT_TRUE(src.ok()) << src.status();
  Fill(**src, 11);
  std::vector<OpSpec> ops;
  for (int i = 0; i < kOps; ++i) {
    ops.push_back({ferry::v1::WRITE, (*src)->id(), i * kOp, "node-b", "landing", i * kOp, kOp});
  }
  auto id = pair_.ca->Submit(ops, absl::Seconds(60));
  ASSERT_TRUE(id.ok()) << id.status();
  // node-b takes mlx5_1 out of service while the slices are on the wire: its connections
  // close under node-a's slices.
  auto down = SetNic(*pair_.cb, "mlx5_1", false);
  ASSERT_TRUE(down.ok()) << down.status();
  ASSERT_EQ(down->nics_size(), 1);
  EXPECT_THAT(down->nics(0).health(), HasSubstr("taken down by the operator: failover test"));

  auto r = pair_.ca->Wait(*id, absl::Seconds(60), true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->state(), ferry::v1::SUCCEEDED) << r->message();
  EXPECT_EQ(std::memcmp((*src)->data(), (*target)->data(), kOp * kOps), 0);
  std::vector<std::string> retries;
  for (const auto& op : r->ops()) {
    for (const auto& line : op.retries()) retries.push_back(line);
  }
  ASSERT_THAT(retries, Not(IsEmpty())) << "mlx5_1 went down after the transfer ended";
  std::printf("%zu slices retried; the first: %s\n", retries.size(), retries[0].c_str());
  EXPECT_THAT(retries[0], HasSubstr("on tcp:mlx5_1->tcp:mlx5_1 failed"));
  EXPECT_THAT(retries[0], HasSubstr("carried by tcp:mlx5_"));

  NicCounts during = Counts(*pair_.ca, "node-b");
  const ferry::v1::NicPeerInfo& paused = during.to_peer[Rail(1)];
  EXPECT_THAT(paused.state(), testing::AnyOf("paused", "probing"));
  EXPECT_GT(paused.errors(), 0u);
  EXPECT_GT(paused.retries(), 0u);
  EXPECT_THAT(paused.last_error(), Not(IsEmpty()));
  // The run's first error, and where the failed rail's slices went (issue 43 items 4, 6).
  EXPECT_THAT(paused.last_error(), HasSubstr("; its slices go to tcp:mlx5_"));
  EXPECT_THAT(Counts(*pair_.cb, "node-a").health[Rail(1)], HasSubstr("taken down"));

  // Back in service: once the pause is over, the next transfer probes mlx5_1 and uses it.
  ASSERT_TRUE(SetNic(*pair_.cb, "tcp:mlx5_1", true).ok());
  absl::SleepFor(absl::Milliseconds(paused.paused_ms_left() + 100));
  auto again = pair_.ca->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "landing", 0, kOp}},
                             absl::Seconds(60), true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(Rails(again->ops(0).legs(0)), testing::Contains(Rail(1)));
  NicCounts after = Counts(*pair_.ca, "node-b");
  EXPECT_EQ(after.to_peer[Rail(1)].state(), "ok");
  EXPECT_GT(after.sent[Rail(1)], during.sent[Rail(1)]);
}

TEST_F(AgentRailsTest, SetNicStateNamesTheRailsThereAreForAnUnknownNic) {
  auto bad = SetNic(*pair_.ca, "mlx5_9", false);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bad.status().message(), HasSubstr("nic: no rail or NIC named 'mlx5_9'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("tcp:mlx5_0"));
}

}  // namespace
}  // namespace ferry
