// `ferryctl topo` and `ferryctl doctor` end to end through their entry points: flags,
// config files, exit codes and messages.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/topo_command.h"

namespace ferry::client {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

std::string Topology(const std::string& name) {
  return std::string(FERRY_FIXTURES) + "/topology/" + name + ".xml";
}

std::string Sysfs(const std::string& name) {
  return std::string(FERRY_FIXTURES) + "/sysfs/" + name;
}

// Writes `text` to a fresh file under the test temp dir and returns its path.
std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result Topo(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  int code = RunTopoCommand(args, out, err);
  return {code, out.str(), err.str()};
}

Result Doctor(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  int code = RunDoctorCommand(args, out, err);
  return {code, out.str(), err.str()};
}

// The doctor runs its probes live; of them only this process's locked-memory limit can FAIL
// (a non-root test run under a small RLIMIT_MEMLOCK). The exit code must follow it.
void ExpectNoFailureButMemlock(const Result& r) {
  const bool memlock_fails = r.out.find("[FAIL] memlock") != std::string::npos;
  EXPECT_EQ(r.code, memlock_fails ? 1 : 0) << r.out << r.err;
  size_t fails = 0;
  for (size_t at = r.out.find("[FAIL]"); at != std::string::npos;
       at = r.out.find("[FAIL]", at + 1)) {
    ++fails;
  }
  EXPECT_EQ(fails, memlock_fails ? 1u : 0u) << r.out;
}

TEST(TopoCommandTest, JsonForATopologyFile) {
  Result r = Topo({"--topology", Topology("dual_socket_sys"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, HasSubstr(R"("gpus":[{"index":0,"pci":"0000:3b:00.0","numa":0,)"
                               R"("nic":"mlx5_0","path":"SYS","gdr":false,"mode":"staged",)"
                               R"("bounce_numa":1,"reason":"GPU 0000:3b:00.0 and mlx5_0 are )"
                               R"(SYS apart)"));
  EXPECT_THAT(r.out, HasSubstr(R"("nics":[{"name":"mlx5_0","pci":"0000:86:00.0","numa":1,)"));
  EXPECT_THAT(r.out, HasSubstr(R"("paths":{"0000:3b:00.0":{"mlx5_0":"SYS"}})"));
}

TEST(TopoCommandTest, TextForATopologyFileWithEqualsForm) {
  Result r = Topo({"--topology=" + Topology("dgx8_switches")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU0  PIX*    PXB     NODE    NODE    SYS"));
  EXPECT_THAT(r.out, HasSubstr("GPU7 gdr via mlx5_7: GPU 0000:b9:00.0 and mlx5_7 are PIX apart"));
}

TEST(TopoCommandTest, ConfigPolicyChangesTheDecision) {
  std::string config = WriteFile("loose.yaml",
                                 "policy:\n  gdr_max_path: SYS\n");
  Result r = Topo({"--topology", Topology("dual_socket_sys"), "--config", config, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(R"("gdr":true,"mode":"gdr","bounce_numa":null)"));
  EXPECT_THAT(r.out, HasSubstr("policy allows GDR up to SYS; using GDR"));

  std::string fail = WriteFile("fail.yaml", "policy:\n  gdr: never\n  fallback: fail\n");
  r = Topo({"--topology", Topology("dual_socket_sys"), "--config", fail});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU0 unavailable via mlx5_0:"));
  EXPECT_THAT(r.out, HasSubstr("policy: gdr=never gdr_max_path=PHB fallback=fail"));
}

TEST(TopoCommandTest, ConfigTopologyAndNicFilterTakeEffect) {
  std::string config = WriteFile(
      "deny.yaml", "topology: " + Topology("switch_pair_far_nic") +
                       "\nnics:\n  deny: [mlx5_0, mlx5_1]\n");
  Result r = Topo({"--config", config});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("topology: " + Topology("switch_pair_far_nic")));
  EXPECT_THAT(r.out, HasSubstr("nics.deny: mlx5_0,mlx5_1"));
  EXPECT_THAT(r.out, HasSubstr("GPU0  PIX     PIX     SYS*"));
  EXPECT_THAT(r.out, HasSubstr("not using nearer mlx5_0 (PIX, excluded by nics.deny)"));
  // --topology wins over the config's topology.
  r = Topo({"--config", config, "--topology", Topology("root_ports_phb")});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("nics.deny names unknown NIC 'mlx5_1'"));
}

TEST(TopoCommandTest, UnknownNicInConfigIsAnErrorNamingFileAndNic) {
  std::string config = WriteFile("allow.yaml", "nics:\n  allow: [mlx5_9]\n");
  Result r = Topo({"--topology", Topology("dual_socket_sys"), "--config", config});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_THAT(r.err, HasSubstr(config));
  EXPECT_THAT(r.err, HasSubstr("nics.allow names unknown NIC 'mlx5_9' (this machine has mlx5_0)"));
}

TEST(TopoCommandTest, UnknownPolicyValueIsAnError) {
  std::string config = WriteFile("bad_policy.yaml", "policy:\n  gdr_max_path: CLOSE\n");
  Result r = Topo({"--topology", Topology("dual_socket_sys"), "--config", config});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("CLOSE"));
  EXPECT_THAT(r.err, HasSubstr(config));
}

TEST(TopoCommandTest, MissingAndMalformedTopologyFiles) {
  Result r = Topo({"--topology", "/nonexistent/machine.xml"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "ferryctl topo: topology file /nonexistent/machine.xml: no such file\n");

  std::string bad = WriteFile("bad_topology.xml", "<topology version=\"2.0\"><object");
  r = Topo({"--topology", bad, "--json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(bad));
  EXPECT_THAT(r.out, IsEmpty());

  r = Topo({"--config", "/nonexistent/ferry.yaml"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/ferry.yaml"));
}

TEST(TopoCommandTest, UsageErrors) {
  Result r = Topo({"--frobnicate"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown argument '--frobnicate'"));
  EXPECT_THAT(r.err, HasSubstr("usage: ferryctl topo"));
  EXPECT_EQ(Topo({"--topology"}).code, 2);
  EXPECT_EQ(Topo({"--topology="}).code, 2);
  EXPECT_EQ(Topo({"--sysfs-root", "/"}).code, 2);  // doctor only
  EXPECT_EQ(Topo({"--json=yes"}).code, 2);
  Result help = Topo({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("--topology FILE"));
}

TEST(TopoCommandTest, LiveMachineWorksOffline) {
  Result r = Topo({"--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(R"("source":"live")"));
}

TEST(DoctorCommandTest, HealthyTreeExitsZero) {
  Result r = Doctor({"--topology", Topology("switch_pair_far_nic"), "--sysfs-root",
                     Sysfs("healthy")});
  ExpectNoFailureButMemlock(r);
  EXPECT_THAT(r.out, HasSubstr("[OK]   iommu: IOMMU dmar0"));
  EXPECT_THAT(r.out, HasSubstr("[OK]   peer-memory: nvidia_peermem module loaded"));
  // The probes ran against this machine's drivers; whatever they found, they say it, for
  // each NIC the plan chose.
  EXPECT_THAT(r.out, HasSubstr("dmabuf-nic mlx5_0: "));
  EXPECT_THAT(r.out, HasSubstr("dmabuf-nic mlx5_1: "));
  EXPECT_THAT(r.out, HasSubstr("memlock: RLIMIT_MEMLOCK of this process: "));
  EXPECT_THAT(r.out, HasSubstr("[OK]   bar1 gpu0: GPU0 (0000:19:00.0) BAR1 is 128 GiB"));
  EXPECT_THAT(r.out, HasSubstr(" FAIL\n"));
}

TEST(DoctorCommandTest, AcsAndIommuFindingsAndJson) {
  Result r = Doctor({"--topology", Topology("switch_pair_far_nic"), "--sysfs-root",
                     Sysfs("acs_on"), "--json"});
  EXPECT_THAT(r.out, HasSubstr(R"({"severity":"WARN","check":"acs 0000:18:00.0",)"));
  const bool memlock_fails =
      r.out.find(R"({"severity":"FAIL","check":"memlock")") != std::string::npos;
  EXPECT_EQ(r.code, memlock_fails ? 1 : 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(memlock_fails ? R"("ok":false)" : R"("ok":true)"));

  r = Doctor({"--topology", Topology("switch_pair_far_nic"), "--sysfs-root",
              Sysfs("iommu_dma")});
  EXPECT_THAT(r.out, HasSubstr("[WARN] iommu:"));
  EXPECT_THAT(r.out, HasSubstr("[WARN] nic mlx5_1: mlx5_1: all ports down"));
}

TEST(DoctorCommandTest, FailingFindingExitsOne) {
  std::string config = WriteFile("doctor_fail.yaml", "policy:\n  fallback: fail\n");
  Result r = Doctor({"--topology", Topology("dual_socket_sys"), "--config", config,
                     "--sysfs-root", Sysfs("healthy")});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("[FAIL] gpu0: GPU 0000:3b:00.0 and mlx5_0 are SYS apart"));
  EXPECT_THAT(r.out, HasSubstr("remedy: for GDR put GPU0 and mlx5_0 under the same root complex"));
}

TEST(DoctorCommandTest, BadInput) {
  EXPECT_EQ(Doctor({"--sysfs-root"}).code, 2);
  Result r = Doctor({"--topology", "/nonexistent/machine.xml"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("ferryctl doctor: topology file /nonexistent/machine.xml"));
}

}  // namespace
}  // namespace ferry::client
