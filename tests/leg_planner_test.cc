// PlanLeg: how a buffer's bytes move, as a pure function of the buffer, the topology plan
// under a policy snapshot, and what the fabric could register.

#include "server/engine/leg_planner.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/topology/discovery.h"
#include "transport/topology/plan.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;

// Buffer memory without memory: the planner only asks where it lives.
class FakeMemory : public BufferMemory {
 public:
  explicit FakeMemory(int gpu) : gpu_(gpu) {}
  char* data() const override { return nullptr; }
  uint64_t size() const override { return 4096; }
  std::string device() const override { return gpu_ < 0 ? "host" : "cuda:" + std::to_string(gpu_); }
  int gpu() const override { return gpu_; }
  std::string backend() const override { return gpu_ < 0 ? "host" : "sim"; }
  absl::StatusOr<BufferMapping> mapping() const override { return HostMapping{}; }

 private:
  int gpu_;
};

class FakeRegion : public fabric::MemoryRegion {
 public:
  void* data() const override { return nullptr; }
  uint64_t length() const override { return 4096; }
  uint64_t remote_address() const override { return 0; }
  uint32_t key() const override { return 1; }
  std::string registration() const override { return "fake"; }
};

const fabric::RailId kTcp{"tcp", ""};

// `failure`: the message of a failed registration attempt with tcp.
std::shared_ptr<Buffer> MakeBuffer(int gpu, bool registered_with_tcp, std::string failure = "") {
  BufferRegistrations registrations;
  if (registered_with_tcp) registrations.regions.emplace_back(kTcp, std::make_unique<FakeRegion>());
  if (!failure.empty()) {
    registrations.attempts.push_back({kTcp, "peer memory", absl::FailedPreconditionError(failure)});
  }
  return std::make_shared<Buffer>(1, "b", std::make_unique<FakeMemory>(gpu),
                                  std::move(registrations), BufferOwner{});
}

class LegPlannerTest : public ::testing::Test {
 protected:
  void Load(const std::string& fixture, config::Policy policy = {}) {
    auto machine = topology::DiscoverMachine(std::string(FERRY_FIXTURES) + "/topology/" + fixture);
    ASSERT_TRUE(machine.ok()) << machine.status();
    machine_ = *std::move(machine);
    auto plan = topology::BuildPlan(machine_, {}, policy);
    ASSERT_TRUE(plan.ok()) << plan.status();
    snapshot_.generation = 7;
    snapshot_.policy = policy;
    snapshot_.plan = *std::move(plan);
  }
  LegPlan Plan(const Buffer& b, int topology_gpu) {
    return PlanLeg(b, topology_gpu, machine_, snapshot_, kTcp);
  }

  topology::Machine machine_;
  PolicySnapshot snapshot_;
};

TEST_F(LegPlannerTest, HostMemoryIsHost) {
  Load("dual_socket_sys.xml");
  LegPlan leg = Plan(*MakeBuffer(-1, true), -1);
  EXPECT_EQ(leg.mode, LegMode::kHost);
  EXPECT_EQ(leg.device, "host");
}

TEST_F(LegPlannerTest, GdrWhenThePathAllowsAndTheFabricReachesTheMemory) {
  Load("dgx8_switches.xml");
  LegPlan leg = Plan(*MakeBuffer(0, true), 0);
  EXPECT_EQ(leg.mode, LegMode::kGdr);
  EXPECT_EQ(leg.nic, "mlx5_0");
  EXPECT_EQ(leg.path, "PIX");
  EXPECT_THAT(leg.reason, HasSubstr("PIX apart"));
}

TEST_F(LegPlannerTest, FailedRegistrationStagesWithItsReason) {
  Load("dgx8_switches.xml");
  LegPlan leg =
      Plan(*MakeBuffer(0, false, "registering GPU cuda:0 memory with tcp failed (no)"), 0);
  EXPECT_EQ(leg.mode, LegMode::kStaged);
  EXPECT_THAT(leg.reason, HasSubstr("with tcp failed (no)"));
  EXPECT_THAT(leg.reason, HasSubstr("staging through host memory on NUMA node"));
  config::Policy fail;
  fail.fallback = config::Fallback::kFail;
  Load("dgx8_switches.xml", fail);
  EXPECT_EQ(Plan(*MakeBuffer(0, false), 0).mode, LegMode::kUnavailable);
}

TEST_F(LegPlannerTest, ALongPathStagesNearTheNicOrFailsByPolicy) {
  Load("dual_socket_sys.xml");
  LegPlan leg = Plan(*MakeBuffer(0, true), 0);
  EXPECT_EQ(leg.mode, LegMode::kStaged);
  EXPECT_EQ(leg.path, "SYS");
  EXPECT_EQ(leg.bounce_numa, 1);  // the NIC's node, not the GPU's
  config::Policy sys;
  sys.gdr_max_path = config::PathClass::kSys;
  Load("dual_socket_sys.xml", sys);
  EXPECT_EQ(Plan(*MakeBuffer(0, true), 0).mode, LegMode::kGdr);
  config::Policy fail;
  fail.fallback = config::Fallback::kFail;
  Load("dual_socket_sys.xml", fail);
  leg = Plan(*MakeBuffer(0, true), 0);
  EXPECT_EQ(leg.mode, LegMode::kUnavailable);
  EXPECT_THAT(leg.reason, HasSubstr("SYS apart"));
}

TEST_F(LegPlannerTest, AGpuOutsideTheTopologyIsStaged) {
  Load("dual_socket_sys.xml");
  LegPlan leg = Plan(*MakeBuffer(1, true), -1);
  EXPECT_EQ(leg.mode, LegMode::kStaged);
  EXPECT_THAT(leg.reason, HasSubstr("not in the topology"));
}

}  // namespace
}  // namespace ferry::server
