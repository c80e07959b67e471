// NIC choice, GDR decision and reasons for every fixture machine under several policies,
// plus the `ferryctl topo` renderings.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "config/config.h"
#include "config/policy.h"
#include "transport/topology/discovery.h"
#include "transport/topology/plan.h"
#include "transport/topology/plan_format.h"
#include "transport/topology/rails.h"

namespace ferry::topology {
namespace {

using config::Fallback;
using config::GdrMode;
using config::NicFilter;
using config::PathClass;
using config::Policy;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Fixture(const std::string& name) {
  return std::string(FERRY_FIXTURES) + "/topology/" + name + ".xml";
}

Machine Load(const std::string& name, const std::string& sysfs = "") {
  DiscoveryOptions options;
  options.xml_path = Fixture(name);
  if (!sysfs.empty()) options.sys_root = std::string(FERRY_FIXTURES) + "/sysfs/" + sysfs;
  absl::StatusOr<Machine> machine = DiscoverMachine(options);
  EXPECT_TRUE(machine.ok()) << machine.status();
  return machine.ok() ? *machine : Machine();
}

Policy MakePolicy(GdrMode gdr, PathClass max_path, Fallback fallback = Fallback::kStaged) {
  Policy policy;
  policy.gdr = gdr;
  policy.gdr_max_path = max_path;
  policy.fallback = fallback;
  return policy;
}

TopologyPlan Plan(const Machine& machine, const Policy& policy = Policy(),
                  const NicFilter& filter = NicFilter()) {
  absl::StatusOr<TopologyPlan> plan = BuildPlan(machine, filter, policy);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : TopologyPlan();
}

// "mlx5_0" for each GPU's chosen NIC, "-" for none.
std::vector<std::string> Choices(const Machine& machine, const TopologyPlan& plan) {
  std::vector<std::string> out;
  for (const GpuDecision& d : plan.gpus) {
    out.push_back(d.nic >= 0 ? machine.nics[d.nic].name : "-");
  }
  return out;
}

std::vector<std::string> Modes(const TopologyPlan& plan) {
  std::vector<std::string> out;
  for (const GpuDecision& d : plan.gpus) out.push_back(TransferModeName(d.mode));
  return out;
}

// --- dual socket: GPU under CPU0, the only NIC under CPU1 ---------------------------------

TEST(PlanTest, DualSocketDefaultPolicyStagesOnTheNicsNode) {
  Machine m = Load("dual_socket_sys");
  TopologyPlan plan = Plan(m);
  EXPECT_EQ(plan.provider, "verbs");
  ASSERT_EQ(plan.gpus.size(), 1u);
  const GpuDecision& d = plan.gpus[0];
  EXPECT_EQ(d.nic, 0);
  EXPECT_EQ(d.path, PathClass::kSys);
  EXPECT_EQ(d.mode, TransferMode::kStaged);
  EXPECT_EQ(d.bounce_numa, 1);
  EXPECT_EQ(d.reason,
            "GPU 0000:3b:00.0 and mlx5_0 are SYS apart (different sockets: NUMA 0 and 1); "
            "policy allows GDR up to PHB; staging through host memory on NUMA node 1");
}

TEST(PlanTest, DualSocketUnderOtherPolicies) {
  Machine m = Load("dual_socket_sys");
  TopologyPlan loose = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kSys));
  EXPECT_EQ(loose.gpus[0].mode, TransferMode::kGdr);
  EXPECT_EQ(loose.gpus[0].bounce_numa, -1);
  EXPECT_THAT(loose.gpus[0].reason, HasSubstr("policy allows GDR up to SYS; using GDR"));

  TopologyPlan always = Plan(m, MakePolicy(GdrMode::kAlways, PathClass::kPix));
  EXPECT_EQ(always.gpus[0].mode, TransferMode::kGdr);
  EXPECT_THAT(always.gpus[0].reason,
              HasSubstr("policy gdr=always allows GDR on any path; using GDR"));

  TopologyPlan never = Plan(m, MakePolicy(GdrMode::kNever, PathClass::kSys));
  EXPECT_EQ(never.gpus[0].mode, TransferMode::kStaged);
  EXPECT_EQ(never.gpus[0].bounce_numa, 1);
  EXPECT_THAT(never.gpus[0].reason,
              HasSubstr("policy gdr=never; staging through host memory on NUMA node 1"));

  TopologyPlan fail = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kPhb, Fallback::kFail));
  EXPECT_EQ(fail.gpus[0].mode, TransferMode::kUnavailable);
  EXPECT_EQ(fail.gpus[0].bounce_numa, -1);
  EXPECT_EQ(fail.gpus[0].reason,
            "GPU 0000:3b:00.0 and mlx5_0 are SYS apart (different sockets: NUMA 0 and 1); "
            "policy allows GDR up to PHB; fallback=fail: no transfer path for this GPU");

  // fallback=fail does not matter when GDR is allowed.
  TopologyPlan fail_ok = Plan(m, MakePolicy(GdrMode::kAlways, PathClass::kPhb, Fallback::kFail));
  EXPECT_EQ(fail_ok.gpus[0].mode, TransferMode::kGdr);
}

// --- 8 GPUs, 8 NICs ---------------------------------------------------------------------

TEST(PlanTest, EightGpuServerPairsEachGpuWithItsSwitchNic) {
  Machine m = Load("dgx8_switches");
  TopologyPlan plan = Plan(m);
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4",
                                            "mlx5_5", "mlx5_6", "mlx5_7"));
  for (const GpuDecision& d : plan.gpus) {
    EXPECT_EQ(d.path, PathClass::kPix);
    EXPECT_EQ(d.mode, TransferMode::kGdr);
  }
  EXPECT_EQ(plan.gpus[4].reason,
            "GPU 0000:95:00.0 and mlx5_4 are PIX apart (behind one PCIe switch); policy "
            "allows GDR up to PHB; using GDR");
  for (const NicState& nic : plan.nics) EXPECT_EQ(nic.gpus.size(), 1u);
}

TEST(PlanTest, DeniedNicFallsBackToTheSiblingLeafAndSaysWhy) {
  Machine m = Load("dgx8_switches");
  NicFilter deny;
  deny.deny = {"mlx5_0"};
  TopologyPlan plan = Plan(m, Policy(), deny);
  // GPU0 takes the PXB NIC of its tree; GPU1 still has mlx5_1 at PIX, which beats spreading.
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_1", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4",
                                            "mlx5_5", "mlx5_6", "mlx5_7"));
  EXPECT_EQ(plan.gpus[0].path, PathClass::kPxb);
  EXPECT_EQ(plan.gpus[0].mode, TransferMode::kGdr);
  EXPECT_EQ(plan.gpus[0].reason,
            "GPU 0000:15:00.0 and mlx5_1 are PXB apart (behind a tree of PCIe switches, not "
            "through the CPU); not using nearer mlx5_0 (PIX, excluded by nics.deny); policy "
            "allows GDR up to PHB; using GDR");
  EXPECT_FALSE(plan.nics[0].selectable);
  EXPECT_EQ(plan.nics[0].excluded, "excluded by nics.deny");
  EXPECT_THAT(plan.nics[1].gpus, ElementsAre(0, 1));

  // NCCL's default (PXB) still allows it; PIX does not.
  TopologyPlan strict = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kPix), deny);
  EXPECT_EQ(strict.gpus[0].mode, TransferMode::kStaged);
  EXPECT_EQ(strict.gpus[0].bounce_numa, 0);
  EXPECT_EQ(strict.gpus[1].mode, TransferMode::kGdr);
}

TEST(PlanTest, EqualNicsAreSpreadBeforeAnyServesTwo) {
  Machine m = Load("dgx8_switches");
  NicFilter deny;
  deny.deny = {"mlx5_0", "mlx5_1"};
  TopologyPlan plan = Plan(m, Policy(), deny);
  // GPU0 and GPU1 only have NODE NICs left (mlx5_2, mlx5_3): one each, not both on mlx5_2.
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_2", "mlx5_3", "mlx5_2", "mlx5_3", "mlx5_4",
                                            "mlx5_5", "mlx5_6", "mlx5_7"));
  EXPECT_EQ(plan.gpus[0].path, PathClass::kNode);
  EXPECT_THAT(Modes(plan), ElementsAre("staged", "staged", "gdr", "gdr", "gdr", "gdr", "gdr",
                                       "gdr"));
  EXPECT_EQ(plan.gpus[1].reason,
            "GPU 0000:19:00.0 and mlx5_3 are NODE apart (across root complexes of NUMA node "
            "0); not using nearer mlx5_0 (PXB, excluded by nics.deny), mlx5_1 (PIX, excluded "
            "by nics.deny); policy allows GDR up to PHB; staging through host memory on NUMA "
            "node 0");

  TopologyPlan node_ok = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kNode), deny);
  EXPECT_EQ(node_ok.gpus[0].mode, TransferMode::kGdr);
}

TEST(PlanTest, AllowListRestrictsChoices) {
  Machine m = Load("dgx8_switches");
  NicFilter allow;
  allow.allow = {"mlx5_4"};
  TopologyPlan plan = Plan(m, Policy(), allow);
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_4", "mlx5_4", "mlx5_4", "mlx5_4", "mlx5_4",
                                            "mlx5_4", "mlx5_4", "mlx5_4"));
  EXPECT_THAT(Modes(plan), ElementsAre("staged", "staged", "staged", "staged", "gdr", "gdr",
                                       "staged", "staged"));
  EXPECT_EQ(plan.gpus[0].bounce_numa, 1);
  EXPECT_THAT(plan.gpus[0].reason, HasSubstr("mlx5_0 (PIX, not in nics.allow)"));
  EXPECT_EQ(plan.nics[0].excluded, "not in nics.allow");
}

// --- one socket, several root complexes --------------------------------------------------

TEST(PlanTest, NodePathPrefersTheFasterLinkAndSkipsDownPorts) {
  Machine m = Load("single_socket_node");
  TopologyPlan plan = Plan(m);
  const GpuDecision& d = plan.gpus[0];
  // mlx5_2 is PHB but its port is down; mlx5_0 and mlx5_1 are both NODE, mlx5_1 is Gen5.
  EXPECT_EQ(m.nics[d.nic].name, "mlx5_1");
  EXPECT_EQ(d.path, PathClass::kNode);
  EXPECT_EQ(d.mode, TransferMode::kStaged);
  EXPECT_EQ(d.bounce_numa, 0);
  EXPECT_EQ(d.reason,
            "GPU 0000:01:00.0 and mlx5_1 are NODE apart (across root complexes of NUMA node "
            "0); not using nearer mlx5_2 (PHB, all ports down); policy allows GDR up to PHB; "
            "staging through host memory on NUMA node 0");
  EXPECT_EQ(plan.nics[2].excluded, "all ports down");

  TopologyPlan node = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kNode));
  EXPECT_EQ(node.gpus[0].mode, TransferMode::kGdr);
  TopologyPlan fail = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kPxb, Fallback::kFail));
  EXPECT_EQ(fail.gpus[0].mode, TransferMode::kUnavailable);

  NicFilter allow;
  allow.allow = {"mlx5_0"};
  TopologyPlan allowed = Plan(m, Policy(), allow);
  EXPECT_EQ(m.nics[allowed.gpus[0].nic].name, "mlx5_0");
}

TEST(PlanTest, LivePortStateFromSysfsMakesTheNearNicUsable) {
  // The healthy tree reports mlx5_2's port ACTIVE: the PHB NIC now wins and GDR is on.
  Machine m = Load("single_socket_node", "healthy");
  TopologyPlan plan = Plan(m);
  EXPECT_EQ(m.nics[plan.gpus[0].nic].name, "mlx5_2");
  EXPECT_EQ(plan.gpus[0].path, PathClass::kPhb);
  EXPECT_EQ(plan.gpus[0].mode, TransferMode::kGdr);
  EXPECT_EQ(plan.gpus[0].reason,
            "GPU 0000:01:00.0 and mlx5_2 are PHB apart (through one CPU root complex); policy "
            "allows GDR up to PHB; using GDR");
}

// --- two GPUs + two NICs behind one switch, plus a far NIC ---------------------------------

TEST(PlanTest, SwitchPairSpreadsOneNicPerGpu) {
  Machine m = Load("switch_pair_far_nic");
  TopologyPlan plan = Plan(m);
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_0", "mlx5_1"));
  EXPECT_THAT(Modes(plan), ElementsAre("gdr", "gdr"));
  EXPECT_TRUE(plan.nics[2].gpus.empty());

  // Strictest policy still allows PIX.
  TopologyPlan pix = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kPix));
  EXPECT_THAT(Modes(pix), ElementsAre("gdr", "gdr"));
}

TEST(PlanTest, SpreadComesBeforeLinkSpeed) {
  // iommu_off tree: mlx5_0 100 Gb/s, mlx5_1 400 Gb/s, mlx5_2 200 Gb/s.
  Machine m = Load("switch_pair_far_nic", "iommu_off");
  TopologyPlan plan = Plan(m);
  // GPU0 takes the faster equal NIC; GPU1 then takes the idle slower one.
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_1", "mlx5_0"));
}

TEST(PlanTest, SmallerClassBeatsAnIdleNic) {
  Machine m = Load("switch_pair_far_nic");
  NicFilter allow;
  allow.allow = {"mlx5_0", "mlx5_2"};
  TopologyPlan plan = Plan(m, Policy(), allow);
  // Both GPUs share mlx5_0 (PIX) although the SYS mlx5_2 serves none: spreading is only
  // among NICs of the same class.
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_0", "mlx5_0"));
  EXPECT_THAT(plan.nics[0].gpus, ElementsAre(0, 1));
}

TEST(PlanTest, DenyingTheSwitchNicsLeavesTheFarOne) {
  Machine m = Load("switch_pair_far_nic");
  NicFilter deny;
  deny.deny = {"mlx5_0", "mlx5_1"};
  TopologyPlan plan = Plan(m, Policy(), deny);
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_2", "mlx5_2"));
  EXPECT_THAT(Modes(plan), ElementsAre("staged", "staged"));
  EXPECT_EQ(plan.gpus[1].bounce_numa, 1);
  EXPECT_EQ(plan.gpus[1].reason,
            "GPU 0000:1a:00.0 and mlx5_2 are SYS apart (different sockets: NUMA 0 and 1); not "
            "using nearer mlx5_0 (PIX, excluded by nics.deny), mlx5_1 (PIX, excluded by "
            "nics.deny); policy allows GDR up to PHB; staging through host memory on NUMA node "
            "1");
}

TEST(PlanTest, DownPortFromSysfsIsNotChosen) {
  Machine m = Load("switch_pair_far_nic", "iommu_dma");  // mlx5_1 port DOWN
  TopologyPlan plan = Plan(m);
  EXPECT_THAT(Choices(m, plan), ElementsAre("mlx5_0", "mlx5_0"));
  EXPECT_EQ(plan.nics[1].excluded, "all ports down");
}

// --- root ports of one root complex ---------------------------------------------------------

TEST(PlanTest, RootPortsArePhbAndDependOnPolicy) {
  Machine m = Load("root_ports_phb");
  TopologyPlan plan = Plan(m);
  EXPECT_EQ(plan.gpus[0].path, PathClass::kPhb);
  EXPECT_EQ(plan.gpus[0].mode, TransferMode::kGdr);
  EXPECT_EQ(plan.gpus[0].reason,
            "GPU 0000:41:00.0 and mlx5_0 are PHB apart (through one CPU root complex); policy "
            "allows GDR up to PHB; using GDR");

  TopologyPlan nccl = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kPxb));
  EXPECT_EQ(nccl.gpus[0].mode, TransferMode::kStaged);
  EXPECT_EQ(nccl.gpus[0].bounce_numa, 0);
  EXPECT_EQ(nccl.gpus[0].reason,
            "GPU 0000:41:00.0 and mlx5_0 are PHB apart (through one CPU root complex); policy "
            "allows GDR up to PXB; staging through host memory on NUMA node 0");

  TopologyPlan never = Plan(m, MakePolicy(GdrMode::kNever, PathClass::kSys, Fallback::kFail));
  EXPECT_EQ(never.gpus[0].mode, TransferMode::kUnavailable);
  EXPECT_THAT(never.gpus[0].reason, HasSubstr("policy gdr=never; fallback=fail"));
}

// --- GPU with no NIC --------------------------------------------------------------------------

TEST(PlanTest, GpuWithoutNicStagesOverTcp) {
  Machine m = Load("gpu_no_nic");
  TopologyPlan plan = Plan(m);
  EXPECT_EQ(plan.provider, "tcp");
  const GpuDecision& d = plan.gpus[0];
  EXPECT_EQ(d.nic, -1);
  EXPECT_EQ(d.path, std::nullopt);
  EXPECT_EQ(d.mode, TransferMode::kStaged);
  EXPECT_EQ(d.bounce_numa, 0);
  EXPECT_EQ(d.reason,
            "GPU 0000:01:00.0 has no usable RDMA NIC (none found); staging through host memory "
            "on NUMA node 0 over tcp");

  // gdr=always cannot conjure a NIC.
  TopologyPlan always = Plan(m, MakePolicy(GdrMode::kAlways, PathClass::kSys));
  EXPECT_EQ(always.gpus[0].mode, TransferMode::kStaged);

  TopologyPlan fail = Plan(m, MakePolicy(GdrMode::kAuto, PathClass::kPhb, Fallback::kFail));
  EXPECT_EQ(fail.gpus[0].mode, TransferMode::kUnavailable);
  EXPECT_EQ(fail.gpus[0].reason,
            "GPU 0000:01:00.0 has no usable RDMA NIC (none found); fallback=fail: no transfer "
            "path for this GPU");
}

TEST(PlanTest, EveryNicExcludedReadsAsNoNic) {
  Machine m = Load("root_ports_phb");
  NicFilter deny;
  deny.deny = {"mlx5_0"};
  TopologyPlan plan = Plan(m, Policy(), deny);
  EXPECT_EQ(plan.provider, "tcp");
  EXPECT_EQ(plan.gpus[0].reason,
            "GPU 0000:41:00.0 has no usable RDMA NIC (mlx5_0: excluded by nics.deny); staging "
            "through host memory on NUMA node 0 over tcp");
}

// --- bad input -------------------------------------------------------------------------------

TEST(PlanTest, UnknownNicInAllowOrDenyIsAnErrorNamingIt) {
  Machine m = Load("switch_pair_far_nic");
  NicFilter allow;
  allow.allow = {"mlx5_0", "mlx5_9"};
  absl::StatusOr<TopologyPlan> plan = BuildPlan(m, allow, Policy());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "nics.allow names unknown NIC 'mlx5_9' (this machine has mlx5_0, mlx5_1, mlx5_2)");

  NicFilter deny;
  deny.deny = {"ib0"};
  plan = BuildPlan(Load("gpu_no_nic"), deny, Policy());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(),
            "nics.deny names unknown NIC 'ib0' (this machine has no RDMA NICs)");
}

// --- renderings ----------------------------------------------------------------------------

TEST(PlanFormatTest, JsonHasTheDocumentedShape) {
  Machine m = Load("dual_socket_sys");
  TopologyPlan plan = Plan(m);
  std::string json = FormatPlanJson(m, plan);
  EXPECT_THAT(json, HasSubstr(
      R"("gpus":[{"index":0,"pci":"0000:3b:00.0","numa":0,"nic":"mlx5_0","path":"SYS",)"
      R"("gdr":false,"mode":"staged","bounce_numa":1,"reason":"GPU 0000:3b:00.0 and mlx5_0 )"
      R"(are SYS apart (different sockets: NUMA 0 and 1); policy allows GDR up to PHB; )"
      R"(staging through host memory on NUMA node 1",)"));
  EXPECT_THAT(json, HasSubstr(R"("nics":[{"name":"mlx5_0","pci":"0000:86:00.0","numa":1,)"));
  EXPECT_THAT(json, HasSubstr(R"("paths":{"0000:3b:00.0":{"mlx5_0":"SYS"}})"));
  EXPECT_THAT(json,
              HasSubstr(R"("policy":{"gdr":"auto","gdr_max_path":"PHB","fallback":"staged"})"));
  EXPECT_EQ(json.back(), '\n');
}

TEST(PlanFormatTest, JsonNullsForNoNicAndGdr) {
  Machine none = Load("gpu_no_nic");
  std::string json = FormatPlanJson(none, Plan(none));
  EXPECT_THAT(json,
              HasSubstr(R"("nic":null,"path":null,"gdr":false,"mode":"staged","bounce_numa":0)"));
  EXPECT_THAT(json, HasSubstr(R"("nics":[])"));
  EXPECT_THAT(json, HasSubstr(R"("paths":{"0000:01:00.0":{}})"));

  Machine phb = Load("root_ports_phb");
  json = FormatPlanJson(phb, Plan(phb));
  EXPECT_THAT(json, HasSubstr(R"("path":"PHB","gdr":true,"mode":"gdr","bounce_numa":null)"));

  Machine fail_m = Load("dual_socket_sys");
  json = FormatPlanJson(fail_m,
                        Plan(fail_m, MakePolicy(GdrMode::kAuto, PathClass::kPhb, Fallback::kFail)));
  EXPECT_THAT(json, HasSubstr(R"("mode":"unavailable","bounce_numa":null)"));
}

TEST(PlanFormatTest, TextShowsMatrixFilterAndDecisions) {
  Machine m = Load("switch_pair_far_nic");
  NicFilter deny;
  deny.deny = {"mlx5_1"};
  std::string text = FormatPlanText(m, Plan(m, Policy(), deny));
  EXPECT_THAT(text, HasSubstr("topology: " + Fixture("switch_pair_far_nic") + "\n"));
  EXPECT_THAT(text, HasSubstr("policy: gdr=auto gdr_max_path=PHB fallback=staged\n"));
  EXPECT_THAT(text, HasSubstr("nics.allow: -  nics.deny: mlx5_1  provider: verbs\n"));
  EXPECT_THAT(text, HasSubstr("      mlx5_0  mlx5_1  mlx5_2  NUMA  PCI\n"
                              "GPU0  PIX*    PIX     SYS     0     0000:19:00.0\n"
                              "GPU1  PIX*    PIX     SYS     0     0000:1a:00.0\n"));
  EXPECT_THAT(text, HasSubstr("mlx5_1  0000:1c:00.0  0     excluded by nics.deny  port 1 ACTIVE"));
  EXPECT_THAT(text, HasSubstr("GPU0 gdr via mlx5_0: GPU 0000:19:00.0 and mlx5_0 are PIX apart"));
}

// --- rails: which NICs carry each memory's traffic ------------------------------------------

std::vector<std::string> Names(const Machine& machine, const std::vector<int>& nics) {
  std::vector<std::string> out;
  for (int n : nics) out.push_back(machine.nics[n].name);
  return out;
}

TEST(RailsTest, EachGpuOfAnEightNicServerKeepsToItsOwnNic) {
  Machine m = Load("dgx8_switches");
  TopologyPlan plan = Plan(m);
  for (int g = 0; g < 8; ++g) {
    EXPECT_THAT(Names(m, GpuNics(m, plan, g)), ElementsAre(absl::StrCat("mlx5_", g))) << g;
  }
  EXPECT_THAT(Names(m, HostNics(m, plan, 0)), ElementsAre("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"));
  EXPECT_THAT(Names(m, HostNics(m, plan, 1)), ElementsAre("mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"));
  EXPECT_EQ(HostNics(m, plan, -1).size(), 8u);  // unplaced memory: every NIC
  EXPECT_EQ(HostNics(m, plan, 7).size(), 8u);   // a node without NICs: every NIC
  EXPECT_TRUE(GpuNics(m, plan, 8).empty());
}

TEST(RailsTest, AGpuWithTwoNicsOfItsOwnUsesBothButNotTheFarOne) {
  Machine m = Load("switch_pair_far_nic");
  m.gpus.pop_back();  // one GPU left behind the switch, with both PIX NICs to itself
  TopologyPlan plan = Plan(m);
  EXPECT_THAT(Names(m, GpuNics(m, plan, 0)), ElementsAre("mlx5_0", "mlx5_1"));
  // Two GPUs on the switch: each keeps its own, the other's NIC is not shared.
  Machine both = Load("switch_pair_far_nic");
  TopologyPlan pair = Plan(both);
  EXPECT_THAT(Names(both, GpuNics(both, pair, 0)), ElementsAre("mlx5_0"));
  EXPECT_THAT(Names(both, GpuNics(both, pair, 1)), ElementsAre("mlx5_1"));
}

TEST(RailsTest, ANicWithoutAPciPathCarriesHostMemoryNeverGpuMemory) {
  // Soft-RoCE beside a GPU (issue 43 item 3): rxe0 used to be "not a PCI device", left out,
  // and every byte went over tcp while the agent opened it anyway.
  Machine m = Load("gpu_no_nic", "soft_roce");
  ASSERT_EQ(m.nics.size(), 1u);
  TopologyPlan plan = Plan(m);
  EXPECT_EQ(plan.provider, "verbs");
  EXPECT_TRUE(plan.nics[0].selectable);
  EXPECT_TRUE(plan.nics[0].host_only);
  EXPECT_THAT(plan.nics[0].host_only_reason, HasSubstr("GPUDirect RDMA needs a PCIe"));
  EXPECT_THAT(Names(m, HostNics(m, plan, 0)), ElementsAre("rxe0"));
  EXPECT_THAT(Names(m, HostNics(m, plan, -1)), ElementsAre("rxe0"));
  EXPECT_TRUE(GpuNics(m, plan, 0).empty());
  // The GPU stages through host memory, and the reason names the NIC that carries it and
  // why it cannot take GPU memory.
  ASSERT_EQ(plan.gpus.size(), 1u);
  EXPECT_EQ(plan.gpus[0].nic, -1);
  EXPECT_EQ(plan.gpus[0].mode, TransferMode::kStaged);
  EXPECT_THAT(plan.gpus[0].reason, HasSubstr("rxe0: not a PCI device"));
  EXPECT_THAT(plan.gpus[0].reason, HasSubstr("over rxe0"));
  std::string text = FormatPlanText(m, plan);
  EXPECT_THAT(text, HasSubstr("selectable, host memory only"));
  EXPECT_THAT(FormatPlanJson(m, plan), HasSubstr("\"host_only\":true"));
  // Denied, it carries nothing and the provider is tcp again.
  NicFilter deny;
  deny.deny = {"rxe0"};
  TopologyPlan denied = Plan(m, Policy(), deny);
  EXPECT_EQ(denied.provider, "tcp");
  EXPECT_TRUE(HostNics(m, denied, 0).empty());
  EXPECT_THAT(denied.gpus[0].reason, HasSubstr("over tcp"));
}

TEST(RailsTest, AnExcludedNicCarriesNothing) {
  Machine m = Load("dgx8_switches");
  NicFilter deny;
  deny.deny = {"mlx5_0"};
  TopologyPlan plan = Plan(m, Policy(), deny);
  EXPECT_THAT(Names(m, GpuNics(m, plan, 0)), ElementsAre("mlx5_1"));
  EXPECT_THAT(Names(m, HostNics(m, plan, 0)), ElementsAre("mlx5_1", "mlx5_2", "mlx5_3"));
}

}  // namespace
}  // namespace ferry::topology
