// `ferryctl doctor` checks against fixture sysfs/procfs trees (tests/fixtures/sysfs), with
// the driver probes replaced by fakes so results do not depend on this machine.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "transport/topology/acs.h"
#include "transport/topology/discovery.h"
#include "transport/topology/doctor.h"
#include "transport/topology/plan.h"
#include "transport/topology/probes.h"

namespace ferry::topology {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kSwitchPair[] = "switch_pair_far_nic";

std::string SysFixture(const std::string& name) {
  return std::string(FERRY_FIXTURES) + "/sysfs/" + name;
}

SupportProbe Probe(SupportProbe::State state, const std::string& detail) {
  return SupportProbe{state, detail};
}

DoctorProbes FakeProbes(SupportProbe::State nic, SupportProbe::State gpu) {
  DoctorProbes probes;
  probes.nic_dmabuf = [nic] { return Probe(nic, "fake NIC probe"); };
  probes.gpu_dmabuf = [gpu] { return Probe(gpu, "fake GPU probe"); };
  return probes;
}

struct DoctorRun {
  Machine machine;
  TopologyPlan plan;
  DoctorReport report;

  // The findings whose check is `check`.
  std::vector<Finding> All(const std::string& check) const {
    std::vector<Finding> out;
    for (const Finding& f : report.findings) {
      if (f.check == check) out.push_back(f);
    }
    return out;
  }
  Finding One(const std::string& check) const {
    std::vector<Finding> found = All(check);
    EXPECT_EQ(found.size(), 1u) << check;
    return found.empty() ? Finding{Severity::kFail, check, "<missing>", ""} : found[0];
  }
};

DoctorRun Doctor(const std::string& machine_name, const std::string& tree,
           const config::Policy& policy = config::Policy(),
           DoctorProbes probes = FakeProbes(SupportProbe::State::kUnknown,
                                            SupportProbe::State::kUnknown)) {
  DoctorRun run;
  DiscoveryOptions options;
  options.xml_path = std::string(FERRY_FIXTURES) + "/topology/" + machine_name + ".xml";
  options.sys_root = SysFixture(tree);
  absl::StatusOr<Machine> machine = DiscoverMachine(options);
  EXPECT_TRUE(machine.ok()) << machine.status();
  if (!machine.ok()) return run;
  run.machine = *machine;
  absl::StatusOr<TopologyPlan> plan = BuildPlan(run.machine, config::NicFilter(), policy);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return run;
  run.plan = *plan;
  run.report = RunDoctor(run.machine, run.plan, SysRoot(SysFixture(tree)), probes);
  return run;
}

TEST(DoctorTest, HealthyNodeHasNoWarningsOnItsGpuPaths) {
  DoctorRun run = Doctor(kSwitchPair, "healthy");
  EXPECT_FALSE(run.report.HasFailure());
  EXPECT_EQ(run.One("gpu0").severity, Severity::kOk);
  EXPECT_THAT(run.One("gpu0").fact, HasSubstr("GPU 0000:19:00.0 and mlx5_0 are PIX apart"));
  EXPECT_EQ(run.One("gpu1").severity, Severity::kOk);
  Finding peer = run.One("peer-memory");
  EXPECT_EQ(peer.severity, Severity::kOk);
  EXPECT_EQ(peer.fact, "nvidia_peermem module loaded (version 570.86.15)");
  Finding gdr = run.One("gdr-support");
  EXPECT_EQ(gdr.severity, Severity::kOk);
  EXPECT_THAT(gdr.fact, HasSubstr("via peer memory"));
  Finding acs = run.One("acs");
  EXPECT_EQ(acs.severity, Severity::kOk);
  EXPECT_EQ(acs.fact,
            "no ACS redirect on GPU-NIC path bridges 0000:18:00.0, 0000:18:02.0, "
            "0000:18:01.0, 0000:18:03.0");
  Finding iommu = run.One("iommu");
  EXPECT_EQ(iommu.severity, Severity::kOk);
  EXPECT_EQ(iommu.fact,
            "IOMMU dmar0; kernel command line: intel_iommu=on iommu=pt; iommu group types: "
            "identity: pass-through");
  // The far NIC has no GPU near it: a warning with a remedy, not a failure.
  Finding far = run.One("nic mlx5_2");
  EXPECT_EQ(far.severity, Severity::kWarn);
  EXPECT_EQ(far.fact, "mlx5_2 has no GPU under its root complex (nearest is SYS)");
  EXPECT_THAT(far.remedy, Not(IsEmpty()));
  EXPECT_EQ(run.One("nic mlx5_0").severity, Severity::kOk);
  EXPECT_EQ(run.One("nic mlx5_0").fact, "mlx5_0: nearest GPU is PIX; serves GPU0");
}

TEST(DoctorTest, AcsRedirectOnPathBridgesWarns) {
  DoctorRun run = Doctor(kSwitchPair, "acs_on");
  EXPECT_TRUE(run.All("acs").empty());
  Finding bridge = run.One("acs 0000:18:02.0");
  EXPECT_EQ(bridge.severity, Severity::kWarn);
  EXPECT_EQ(bridge.fact,
            "bridge 0000:18:02.0 on the path GPU0 (0000:19:00.0) - mlx5_0 has ACS P2P Request "
            "Redirect, P2P Completion Redirect enabled (ACS control 0x001d): peer-to-peer "
            "traffic is sent up to the root complex");
  EXPECT_THAT(bridge.remedy, HasSubstr("setpci -s 0000:18:02.0 ECAP_ACS+0x6.w=0000"));
  for (const char* b : {"acs 0000:18:00.0", "acs 0000:18:01.0", "acs 0000:18:03.0"}) {
    EXPECT_EQ(run.One(b).severity, Severity::kWarn);
  }
  // Legacy nv_peer_mem registers itself under memory_peers.
  EXPECT_EQ(run.One("peer-memory").fact,
            "NVIDIA peer memory client registered (/sys/kernel/mm/memory_peers/nv_mem/version: "
            "1.3-0)");
  EXPECT_EQ(run.One("iommu").severity, Severity::kOk);  // iommu=pt on the command line
  EXPECT_FALSE(run.report.HasFailure());
}

TEST(DoctorTest, TranslatingIommuMissingPeerMemoryAndDownPort) {
  DoctorRun run = Doctor(kSwitchPair, "iommu_dma");
  Finding iommu = run.One("iommu");
  EXPECT_EQ(iommu.severity, Severity::kWarn);
  EXPECT_EQ(iommu.fact,
            "IOMMU dmar0, dmar1; kernel command line: intel_iommu=on; iommu group types: "
            "DMA-FQ: translating DMA");
  EXPECT_THAT(iommu.remedy, HasSubstr("iommu=pt"));

  Finding peer = run.One("peer-memory");
  EXPECT_EQ(peer.severity, Severity::kWarn);
  EXPECT_THAT(peer.remedy, HasSubstr("modprobe nvidia_peermem"));

  Finding down = run.One("nic mlx5_1");
  EXPECT_EQ(down.severity, Severity::kWarn);
  EXPECT_EQ(down.fact, "mlx5_1: all ports down (port 1 DOWN); not chosen for any GPU");
  // With mlx5_1 down both GPUs share mlx5_0.
  Finding shared = run.One("nic mlx5_0");
  EXPECT_EQ(shared.severity, Severity::kWarn);
  EXPECT_EQ(shared.fact, "mlx5_0 serves GPU0, GPU1: they share its bandwidth");

  // Unprivileged config space reads stop at 64 bytes: ACS is unknown, and said so.
  Finding acs = run.One("acs");
  EXPECT_EQ(acs.severity, Severity::kWarn);
  EXPECT_EQ(acs.fact,
            "unknown: ACS of bridges 0000:18:00.0 (only 64 bytes readable), 0000:18:02.0 (only "
            "64 bytes readable), 0000:18:01.0 (only 64 bytes readable) could not be read");
  EXPECT_THAT(acs.remedy, HasSubstr("root"));

  // GDR is planned, nothing could be verified: a warning, not a failure.
  Finding gdr = run.One("gdr-support");
  EXPECT_EQ(gdr.severity, Severity::kWarn);
  EXPECT_EQ(gdr.fact, "GPU0, GPU1 plan GDR, but neither peer memory nor DMA-BUF could be verified");
  EXPECT_THAT(run.One("dmabuf-nic").fact, HasSubstr("unknown: fake NIC probe"));
  EXPECT_FALSE(run.report.HasFailure());
}

TEST(DoctorTest, GdrPlannedWithoutAnyKernelSupportFails) {
  DoctorRun run = Doctor(kSwitchPair, "iommu_dma", config::Policy(),
                   FakeProbes(SupportProbe::State::kUnsupported, SupportProbe::State::kUnknown));
  Finding gdr = run.One("gdr-support");
  EXPECT_EQ(gdr.severity, Severity::kFail);
  EXPECT_THAT(gdr.fact, HasSubstr("no peer memory client and DMA-BUF is not supported"));
  EXPECT_THAT(gdr.remedy, HasSubstr("gdr: never"));
  EXPECT_TRUE(run.report.HasFailure());
  EXPECT_EQ(run.One("dmabuf-nic").severity, Severity::kWarn);

  // No peer memory, but DMA-BUF on both sides: fine.
  DoctorRun dmabuf = Doctor(kSwitchPair, "iommu_dma", config::Policy(),
                      FakeProbes(SupportProbe::State::kSupported,
                                 SupportProbe::State::kSupported));
  EXPECT_EQ(dmabuf.One("gdr-support").severity, Severity::kOk);
  EXPECT_THAT(dmabuf.One("gdr-support").fact, HasSubstr("via DMA-BUF"));
  EXPECT_EQ(dmabuf.One("dmabuf-gpu").severity, Severity::kOk);

  // Nothing plans GDR: no failure even without support.
  config::Policy never;
  never.gdr = config::GdrMode::kNever;
  DoctorRun staged = Doctor(kSwitchPair, "iommu_dma", never,
                      FakeProbes(SupportProbe::State::kUnsupported,
                                 SupportProbe::State::kUnsupported));
  EXPECT_EQ(staged.One("gdr-support").severity, Severity::kWarn);
  EXPECT_FALSE(staged.report.HasFailure());
  EXPECT_EQ(staged.One("gpu0").severity, Severity::kWarn);
  EXPECT_EQ(staged.One("gpu0").remedy, "set policy gdr: auto to allow GDR");
}

TEST(DoctorTest, NoIommuAndBridgesWithoutAcs) {
  DoctorRun run = Doctor(kSwitchPair, "iommu_off");
  Finding iommu = run.One("iommu");
  EXPECT_EQ(iommu.severity, Severity::kOk);
  EXPECT_EQ(iommu.fact,
            "no IOMMU active (/sys/class/iommu is empty; kernel command line: amd_iommu=off)");
  EXPECT_EQ(run.One("peer-memory").fact,
            "NVIDIA peer memory client registered "
            "(/sys/kernel/mm/memory_peers/nv_mem_nc/version: 1.3-0)");
  EXPECT_EQ(run.One("acs").severity, Severity::kOk);
}

TEST(DoctorTest, StagedAndUnavailableGpusSayWhatWouldEnableGdr) {
  DoctorRun staged = Doctor("dual_socket_sys", "healthy");
  Finding gpu = staged.One("gpu0");
  EXPECT_EQ(gpu.severity, Severity::kWarn);
  EXPECT_THAT(gpu.fact, HasSubstr("are SYS apart"));
  EXPECT_EQ(gpu.remedy,
            "for GDR put GPU0 and mlx5_0 under the same root complex (a PCIe switch is best; "
            "mlx5_0 sits on NUMA node 1), or set policy gdr_max_path: SYS if this platform "
            "routes such peer-to-peer traffic well");
  EXPECT_FALSE(staged.report.HasFailure());
  EXPECT_THAT(staged.All("acs"), IsEmpty());  // no shared PCI ancestor: no bridges to check

  config::Policy fail;
  fail.fallback = config::Fallback::kFail;
  DoctorRun unavailable = Doctor("dual_socket_sys", "healthy", fail);
  EXPECT_EQ(unavailable.One("gpu0").severity, Severity::kFail);
  EXPECT_THAT(unavailable.One("gpu0").remedy, HasSubstr("or set policy fallback: staged"));
  EXPECT_TRUE(unavailable.report.HasFailure());
}

TEST(DoctorTest, NoGpusAndNoNics) {
  DoctorRun run = Doctor("gpu_no_nic", "iommu_off");
  EXPECT_EQ(run.One("nics").severity, Severity::kWarn);
  EXPECT_EQ(run.One("nics").fact, "no RDMA NICs found; the tcp provider will be used");
  EXPECT_EQ(run.One("gpu0").severity, Severity::kWarn);
  EXPECT_THAT(run.One("gpu0").remedy, HasSubstr("install an RDMA NIC near GPU0"));
}

TEST(DoctorTest, TextAndJsonRenderings) {
  DoctorRun run = Doctor(kSwitchPair, "iommu_dma");
  std::string text = FormatDoctorText(run.report);
  EXPECT_THAT(text, HasSubstr("[WARN] iommu: IOMMU dmar0, dmar1;"));
  EXPECT_THAT(text, HasSubstr("[OK]   gpu0: GPU 0000:19:00.0 and mlx5_0 are PIX apart"));
  EXPECT_THAT(text, HasSubstr("       remedy: boot with iommu=pt"));
  EXPECT_THAT(text, HasSubstr(" WARN, 0 FAIL\n"));
  std::string json = FormatDoctorJson(run.report, run.machine, run.plan);
  EXPECT_THAT(json, HasSubstr(R"({"ok":true,"counts":{"ok":)"));
  EXPECT_THAT(
      json, HasSubstr(R"({"severity":"WARN","check":"nic mlx5_1","fact":"mlx5_1: all ports down)"));
  EXPECT_THAT(json, HasSubstr(R"("topology":{"source":)"));
  EXPECT_THAT(
      json, HasSubstr(R"("paths":{"0000:19:00.0":{"mlx5_0":"PIX","mlx5_1":"PIX","mlx5_2":"SYS"})"));
}

TEST(AcsTest, ParsesTheExtendedCapabilityList) {
  std::string space(0x200, '\0');
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) space[at + i] = static_cast<char>(v >> (8 * i));
  };
  EXPECT_EQ(ParseAcs(space.substr(0, 64)).kind, AcsReading::Kind::kUnreadable);
  EXPECT_EQ(ParseAcs(space.substr(0, 256)).kind, AcsReading::Kind::kUnreadable);
  EXPECT_EQ(ParseAcs(space).kind, AcsReading::Kind::kNoCapability);  // empty list
  put32(0x100, 0x0001 | (2 << 16) | (0x180u << 20));                   // AER -> 0x180
  put32(0x180, 0x000d | (1 << 16));                                    // ACS, end
  put32(0x184, 0x005f | (0x0004u << 16));                              // control: RR
  AcsReading acs = ParseAcs(space);
  ASSERT_EQ(acs.kind, AcsReading::Kind::kCapability);
  EXPECT_EQ(acs.control, 0x0004);
  EXPECT_TRUE(acs.Redirects());
  EXPECT_EQ(acs.EnabledNames(), "P2P Request Redirect");
  put32(0x184, 0x005f | (0x0010u << 16));  // only Upstream Forwarding: harmless here
  EXPECT_FALSE(ParseAcs(space).Redirects());
  put32(0x184, 0x005f | (0x0003u << 16));  // Source Validation, Translation Blocking
  EXPECT_FALSE(ParseAcs(space).Redirects());
  EXPECT_EQ(ParseAcs(space).EnabledNames(), "");
  put32(0x184, 0x005f | (0x0021u << 16));  // SV + P2P Egress Control: redirects
  EXPECT_TRUE(ParseAcs(space).Redirects());
  EXPECT_EQ(ParseAcs(space).EnabledNames(), "P2P Egress Control");
  // A list that points at itself must end.
  put32(0x100, 0x0001 | (0x100u << 20));
  EXPECT_EQ(ParseAcs(space).kind, AcsReading::Kind::kNoCapability);
}

TEST(ProbeTest, DmabufErrnoClassification) {
  EXPECT_EQ(ClassifyDmabufErrno("mlx5_0", EOPNOTSUPP).state, SupportProbe::State::kUnsupported);
  EXPECT_EQ(ClassifyDmabufErrno("mlx5_0", EPROTONOSUPPORT).detail,
            "mlx5_0: ibv_reg_dmabuf_mr is not supported (EPROTONOSUPPORT)");
  SupportProbe ok = ClassifyDmabufErrno("mlx5_0", EBADF);
  EXPECT_EQ(ok.state, SupportProbe::State::kSupported);
  EXPECT_EQ(ok.detail, "mlx5_0: ibv_reg_dmabuf_mr is implemented (EBADF on fd -1)");
  EXPECT_STREQ(SupportStateName(SupportProbe::State::kUnknown), "unknown");
}

TEST(ProbeTest, RealProbesNeverCrashAndExplainThemselves) {
  SupportProbe nic = ProbeNicDmabuf();
  EXPECT_THAT(nic.detail, Not(IsEmpty()));
  if (nic.state == SupportProbe::State::kUnknown) {
    // Here: no RDMA in the kernel, so rdma-core answers NULL with ENOSYS (or no devices).
    EXPECT_THAT(nic.detail, HasSubstr("no RDMA devices"));
  }
  SupportProbe gpu = ProbeGpuDmabuf();
  EXPECT_THAT(gpu.detail, Not(IsEmpty()));
}

}  // namespace
}  // namespace ferry::topology
