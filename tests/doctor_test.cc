// `ferryctl doctor` checks against fixture sysfs/procfs trees (tests/fixtures/sysfs), with
// the driver probes replaced by fakes so results do not depend on this machine.
#include <sys/resource.h>

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

// The same answer from every NIC; locked memory unlimited unless a test says otherwise.
DoctorProbes FakeProbes(SupportProbe::State nic, SupportProbe::State gpu) {
  DoctorProbes probes;
  probes.nic_dmabuf = [nic](const std::string& name) {
    return Probe(nic, "fake NIC probe of " + name);
  };
  probes.gpu_dmabuf = [gpu] { return Probe(gpu, "fake GPU probe"); };
  probes.memlock = [] { return MemlockLimit{}; };
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
  // The one finding `check`, after expecting its severity and fact.
  Finding Expect(const std::string& check, Severity severity, const std::string& fact) const {
    Finding f = One(check);
    EXPECT_EQ(SeverityName(f.severity), std::string(SeverityName(severity))) << check;
    EXPECT_EQ(f.fact, fact) << check;
    return f;
  }
};

DoctorProbes UnknownProbes() {
  return FakeProbes(SupportProbe::State::kUnknown, SupportProbe::State::kUnknown);
}

// The fixture machine `machine_name`, with NIC port state from the sysfs tree `tree`, or
// from the file alone when `tree` is "".
Machine LoadMachine(const std::string& machine_name, const std::string& tree = "") {
  DiscoveryOptions options;
  options.xml_path = std::string(FERRY_FIXTURES) + "/topology/" + machine_name + ".xml";
  if (!tree.empty()) options.sys_root = SysFixture(tree);
  absl::StatusOr<Machine> machine = DiscoverMachine(options);
  EXPECT_TRUE(machine.ok()) << machine.status();
  return machine.ok() ? *machine : Machine();
}

// The doctor on `machine` planned from `config` (nics filter, policy), against `tree`.
DoctorRun DoctorOn(Machine machine, const std::string& tree,
                   config::Config config = config::Config(),
                   DoctorProbes probes = UnknownProbes()) {
  DoctorRun run;
  run.machine = std::move(machine);
  absl::StatusOr<TopologyPlan> plan = BuildPlan(run.machine, config.nics, config.policy);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return run;
  run.plan = *plan;
  run.report = RunDoctor(run.machine, run.plan, SysRoot(SysFixture(tree)), probes, config);
  return run;
}

DoctorRun Doctor(const std::string& machine_name, const std::string& tree,
                 const config::Policy& policy = config::Policy(),
                 DoctorProbes probes = UnknownProbes(), config::Config config = config::Config()) {
  config.policy = policy;
  return DoctorOn(LoadMachine(machine_name, tree), tree, config, probes);
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
  run.Expect("iommu", Severity::kOk,
             "IOMMU dmar0; kernel command line: intel_iommu=on iommu=pt; identity: GPU0 (group "
             "30), GPU1 (group 31), mlx5_0 (group 32), mlx5_1 (group 33): GPU and NIC DMA "
             "passes through");
  run.Expect("bar1 gpu1", Severity::kOk,
             "GPU1 (0000:1a:00.0) BAR1 is 128 GiB, room for the 1 GiB GPU pool");
  // Gen4 NICs in Gen5 switch ports run at what both ends support: no warning.
  run.Expect("pcie-link", Severity::kOk,
             "4 PCIe link(s) on the GPU-NIC paths run at the speed and width both ends support");
  run.Expect("memlock", Severity::kOk,
             "RLIMIT_MEMLOCK of this process: unlimited; enough for the 1 GiB ferryd registers "
             "with a NIC (host pool 1 GiB)");
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
            "IOMMU dmar0, dmar1; kernel command line: intel_iommu=on; DMA-FQ: GPU0 (group 7), "
            "GPU1 (group 8), mlx5_0 (group 7): the IOMMU translates the DMA of GPU0, GPU1, "
            "mlx5_0");
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
  EXPECT_EQ(run.One("dmabuf-nic mlx5_0").fact, "unknown: fake NIC probe of mlx5_0");
  EXPECT_THAT(run.All("dmabuf-nic mlx5_1"), IsEmpty());  // down: chosen for no GPU
  // No link files in this tree: the link check says nothing rather than guess.
  EXPECT_THAT(run.All("pcie-link"), IsEmpty());
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
  EXPECT_EQ(run.One("dmabuf-nic mlx5_0").severity, Severity::kWarn);

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

TEST(DoctorTest, SoftRoceIsAnRdmaNicForHostMemory) {
  // rxe0 is what the agent opens: doctor must not say "no RDMA NICs; tcp" (issue 43 item 2).
  DoctorRun run = Doctor("gpu_no_nic", "soft_roce");
  EXPECT_EQ(run.One("nics").severity, Severity::kOk);
  EXPECT_EQ(run.One("nics").fact, "1 RDMA NIC(s): rxe0; provider verbs");
  EXPECT_EQ(run.One("nic rxe0").severity, Severity::kOk);
  EXPECT_THAT(run.One("nic rxe0").fact, HasSubstr("carries host memory, never GPU memory"));
  EXPECT_THAT(run.One("gpu0").fact, HasSubstr("staging through host memory"));
  EXPECT_THAT(run.One("gpu0").fact, HasSubstr("over rxe0"));
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

// Issue 12 item 8: the IOMMU verdict is the GPU's and NIC's own group, not "every group".
TEST(DoctorTest, IommuIsJudgedByTheGpuAndNicGroupsOnly) {
  // A USB controller in a DMA group and a VFIO device do not make GPU-NIC DMA translated.
  DoctorRun mixed = Doctor(kSwitchPair, "iommu_mixed");
  Finding iommu = mixed.Expect(
      "iommu", Severity::kOk,
      "IOMMU dmar0; kernel command line: intel_iommu=on; identity: GPU0 (group 30), GPU1 "
      "(group 31), mlx5_0 (group 32), mlx5_1 (group 33): GPU and NIC DMA passes through");
  // iommu=pt is only the default: a NIC whose group was switched to DMA-FQ is translated.
  DoctorRun pt = Doctor(kSwitchPair, "iommu_pt_nic");
  iommu =
      pt.Expect("iommu", Severity::kWarn,
                "IOMMU dmar0; kernel command line: iommu=pt; DMA-FQ: mlx5_1 (group 40); identity: "
                "GPU0 (group 30), GPU1 (group 31), mlx5_0 (group 32): the IOMMU translates the DMA "
                "of mlx5_1");
  EXPECT_THAT(iommu.remedy, HasSubstr("echo identity > /sys/kernel/iommu_groups/N/type"));
  // No iommu_group link: the device is not behind the IOMMU (acs_on has none).
  EXPECT_THAT(Doctor(kSwitchPair, "acs_on").One("iommu").fact,
              HasSubstr("no iommu group: GPU0, GPU1, mlx5_0, mlx5_1: GPU and NIC DMA passes"));
}

TEST(DoctorTest, AcsSourceValidationDoesNotRedirect) {
  // SV, Translation Blocking and Upstream Forwarding on every switch port: P2P still turns
  // around in the switch.
  DoctorRun run = Doctor(kSwitchPair, "acs_sv");
  Finding acs = run.One("acs");
  EXPECT_EQ(acs.severity, Severity::kOk);
  EXPECT_THAT(acs.fact, HasSubstr("no ACS redirect on GPU-NIC path bridges 0000:18:00.0"));
  for (const char* b : {"acs 0000:18:00.0", "acs 0000:18:01.0", "acs 0000:18:02.0"}) {
    EXPECT_THAT(run.All(b), IsEmpty()) << b;
  }
}

TEST(DoctorTest, MemlockBelowWhatFerrydRegistersFails) {
  auto with_memlock = [](MemlockLimit limit) {
    DoctorProbes probes = FakeProbes(SupportProbe::State::kUnknown, SupportProbe::State::kUnknown);
    probes.memlock = [limit] { return limit; };
    return probes;
  };
  // The systemd / kernel default, not root: the 1 GiB host pool cannot be registered.
  DoctorRun low = Doctor(kSwitchPair, "healthy", config::Policy(),
                         with_memlock({8ull << 20, /*ipc_lock=*/false}));
  Finding memlock =
      low.Expect("memlock", Severity::kFail,
                 "RLIMIT_MEMLOCK of this process: 8 MiB without CAP_IPC_LOCK, below the 1 GiB "
                 "ferryd registers with a NIC (host pool 1 GiB): ibv_reg_mr fails with ENOMEM");
  EXPECT_THAT(memlock.remedy, HasSubstr("LimitMEMLOCK=infinity"));
  EXPECT_THAT(memlock.remedy, HasSubstr("--ulimit memlock=-1"));
  EXPECT_THAT(memlock.remedy, HasSubstr("/etc/security/limits.conf"));
  EXPECT_TRUE(low.report.HasFailure());

  // CAP_IPC_LOCK (root) is not held to the limit.
  DoctorRun root = Doctor(kSwitchPair, "healthy", config::Policy(),
                          with_memlock({8ull << 20, /*ipc_lock=*/true}));
  EXPECT_EQ(root.One("memlock").severity, Severity::kOk);
  EXPECT_THAT(root.One("memlock").fact, HasSubstr("CAP_IPC_LOCK held"));

  // A staged GPU adds its NUMA node's bounce pool: 4 MiB chunks x depth 4 x 4 legs.
  DoctorRun staged = Doctor("dual_socket_sys", "healthy", config::Policy(),
                            with_memlock({1ull << 30, /*ipc_lock=*/false}));
  EXPECT_EQ(staged.One("memlock").severity, Severity::kFail);
  EXPECT_THAT(staged.One("memlock").fact,
              HasSubstr("below the 1088 MiB ferryd registers with a NIC (host pool 1 GiB + 1 "
                        "bounce pool(s) of 64 MiB)"));

  // The configured host pool is what counts.
  config::Config small;
  small.host_pool_bytes = 4ull << 20;
  DoctorRun fits = Doctor(kSwitchPair, "healthy", config::Policy(),
                          with_memlock({8ull << 20, /*ipc_lock=*/false}), small);
  EXPECT_EQ(fits.One("memlock").severity, Severity::kOk);

  // Without an RDMA NIC nothing is registered.
  DoctorRun tcp = Doctor("gpu_no_nic", "iommu_off", config::Policy(),
                         with_memlock({64ull << 10, /*ipc_lock=*/false}));
  EXPECT_EQ(tcp.One("memlock").severity, Severity::kOk);
  EXPECT_THAT(tcp.One("memlock").fact, HasSubstr("the tcp provider pins nothing"));
}

TEST(DoctorTest, DmabufIsProbedOnEachChosenNic) {
  std::vector<std::string> asked;
  DoctorProbes probes = FakeProbes(SupportProbe::State::kUnknown, SupportProbe::State::kSupported);
  probes.nic_dmabuf = [&asked](const std::string& nic) {
    asked.push_back(nic);
    return Probe(
        nic == "mlx5_1" ? SupportProbe::State::kSupported : SupportProbe::State::kUnsupported,
        nic + ": fake");
  };
  // no_driver has no peer memory: each GPU's GDR rests on DMA-BUF through its own NIC.
  DoctorRun run = Doctor(kSwitchPair, "no_driver", config::Policy(), probes);
  EXPECT_EQ(asked, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));  // not mlx5_2
  EXPECT_EQ(run.One("dmabuf-nic mlx5_0").severity, Severity::kWarn);
  EXPECT_EQ(run.One("dmabuf-nic mlx5_0").fact, "mlx5_0: fake");
  EXPECT_EQ(run.One("dmabuf-nic mlx5_1").severity, Severity::kOk);
  run.Expect("gdr-support", Severity::kFail,
             "GPU0 plan GDR, but there is no peer memory client and DMA-BUF is not supported: "
             "registering GPU memory will fail");
}

TEST(DoctorTest, GpuLessNodeGivesNoGpuRemedies) {
  DoctorRun run = Doctor("nic_no_gpu", "no_gpu");
  EXPECT_EQ(run.report.Count(Severity::kWarn), 0) << FormatDoctorText(run.report);
  EXPECT_EQ(run.One("gpus").fact,
            "no NVIDIA GPUs in " + std::string(FERRY_FIXTURES) +
                "/topology/nic_no_gpu.xml: this node serves host memory only");
  EXPECT_EQ(run.One("gdr-support").severity, Severity::kOk);
  EXPECT_THAT(run.One("gdr-support").fact, HasSubstr("no GPU on this node"));
  for (const char* check : {"peer-memory", "dmabuf-gpu", "dmabuf-nic mlx5_0", "bar1 gpu0"}) {
    EXPECT_THAT(run.All(check), IsEmpty()) << check;
  }
  for (const Finding& f : run.report.findings) {
    EXPECT_THAT(f.remedy, Not(HasSubstr("nvidia_peermem"))) << f.check;
  }
  // A loaded driver that sees no GPU is worth a warning.
  Finding driver = Doctor("nic_no_gpu", "healthy").One("gpus");
  EXPECT_EQ(driver.severity, Severity::kWarn);
  EXPECT_THAT(driver.fact, HasSubstr("though a driver is loaded: NVRM version:"));
}

TEST(DoctorTest, MissingDriverIsSaidNotQuotedFromCuda) {
  DoctorProbes probes = FakeProbes(SupportProbe::State::kUnknown, SupportProbe::State::kUnknown);
  probes.gpu_dmabuf = [] {
    return Probe(SupportProbe::State::kUnknown,
                 "CUDA: CUDA driver version is insufficient for CUDA runtime version");
  };
  DoctorRun run = Doctor(kSwitchPair, "no_driver", config::Policy(), probes);
  Finding gpu = run.Expect(
      "dmabuf-gpu", Severity::kWarn,
      "no NVIDIA driver installed (no /proc/driver/nvidia/version, no /sys/module/nvidia)");
  EXPECT_THAT(gpu.remedy, HasSubstr("install the NVIDIA driver"));
  EXPECT_THAT(run.One("peer-memory").remedy,
              HasSubstr("install the NVIDIA driver, then modprobe nvidia_peermem"));
  for (const Finding& f : run.report.findings) {
    EXPECT_THAT(f.fact, Not(HasSubstr("insufficient"))) << f.check;
  }
  // With a driver installed, CUDA's own words are the fact.
  EXPECT_EQ(Doctor(kSwitchPair, "healthy", config::Policy(), probes).One("dmabuf-gpu").fact,
            "unknown: CUDA: CUDA driver version is insufficient for CUDA runtime version");
}

TEST(DoctorTest, Bar1SmallerThanTheGpuPoolWarns) {
  DoctorRun run = Doctor(kSwitchPair, "small_bar1");
  Finding small =
      run.Expect("bar1 gpu0", Severity::kWarn,
                 "GPU0 (0000:19:00.0) BAR1 is 256 MiB, smaller than the 1 GiB GPU pool ferryd "
                 "registers with the NIC: GDR registration of the pool fails");
  EXPECT_THAT(small.remedy, HasSubstr("enable Above 4G Decoding and Resizable BAR in the BIOS"));
  Finding unplaced = run.One("bar1 gpu1");
  EXPECT_EQ(unplaced.severity, Severity::kWarn);
  EXPECT_THAT(unplaced.fact, HasSubstr("GPU1 (0000:1a:00.0) BAR1 (128 GiB) has no address"));
  // The pool is what the BAR must hold: a 128 MiB pool fits a 256 MiB BAR1.
  config::Config config;
  config.gpu_pool_bytes = 128ull << 20;
  DoctorRun fits =
      Doctor(kSwitchPair, "small_bar1", config::Policy(),
             FakeProbes(SupportProbe::State::kUnknown, SupportProbe::State::kUnknown), config);
  fits.Expect("bar1 gpu0", Severity::kOk,
              "GPU0 (0000:19:00.0) BAR1 is 256 MiB, room for the 128 MiB GPU pool");
}

TEST(DoctorTest, PcieLinkBelowWhatBothEndsSupportWarns) {
  DoctorRun run = Doctor(kSwitchPair, "link_degraded");
  Finding narrow = run.Expect(
      "pcie-link 0000:1a:00.0", Severity::kWarn,
      "PCIe link GPU1 (0000:1a:00.0) - bridge 0000:18:01.0 on the path GPU1 - mlx5_1 runs "
      "at 32.0 GT/s x8; both ends support 32.0 GT/s x16");
  EXPECT_THAT(narrow.remedy, HasSubstr("reseat the card"));
  EXPECT_THAT(narrow.remedy, HasSubstr("BIOS"));
  EXPECT_THAT(narrow.remedy, HasSubstr("pcie_aspm=off"));
  run.Expect("pcie-link 0000:1c:00.0", Severity::kWarn,
             "PCIe link mlx5_1 (0000:1c:00.0) - bridge 0000:18:03.0 on the path GPU1 - mlx5_1 "
             "runs at 8.0 GT/s x16; both ends support 16.0 GT/s x16");
  // An idle GPU's slower link is mentioned, not warned about; mlx5_0's Gen4 link is fine.
  EXPECT_THAT(run.All("pcie-link 0000:19:00.0"), IsEmpty());
  EXPECT_THAT(run.All("pcie-link 0000:1b:00.0"), IsEmpty());
  Finding summary = run.One("pcie-link");
  EXPECT_EQ(summary.severity, Severity::kOk);
  EXPECT_THAT(summary.fact, HasSubstr("1 PCIe link(s) on the GPU-NIC paths run at the speed"));
  EXPECT_THAT(summary.fact, HasSubstr("GPU0 (0000:19:00.0) - bridge 0000:18:00.0 at 2.5 GT/s "
                                      "x16 of 32.0 GT/s x16"));
}

// --- rails: the chosen NIC carries the traffic; no NIC is shared while one as near idles ---

constexpr char kDgx8[] = "dgx8_switches";

config::Config Filter(std::vector<std::string> allow, std::vector<std::string> deny) {
  config::Config config;
  config.nics.allow = std::move(allow);
  config.nics.deny = std::move(deny);
  return config;
}

// The findings "rails <something>": the warnings of the rail check.
std::vector<Finding> RailWarnings(const DoctorRun& run) {
  std::vector<Finding> out;
  for (const Finding& f : run.report.findings) {
    if (f.check.rfind("rails ", 0) == 0) out.push_back(f);
  }
  return out;
}

TEST(DoctorTest, RailsOfHealthyNodesWarnNothing) {
  // Port state from the XML: the healthy tree's port rates are another machine's.
  DoctorRun dgx = DoctorOn(LoadMachine(kDgx8), "healthy");
  EXPECT_THAT(RailWarnings(dgx), IsEmpty());
  dgx.Expect("rails", Severity::kOk,
             "GPU rails, chosen NIC first: GPU0 mlx5_0, GPU1 mlx5_1, GPU2 mlx5_2, GPU3 mlx5_3, "
             "GPU4 mlx5_4, GPU5 mlx5_5, GPU6 mlx5_6, GPU7 mlx5_7; no NIC is shared while one "
             "as near is idle");
  // One GPU behind a switch with two NICs of its own stripes over both.
  Machine one = LoadMachine(kSwitchPair, "healthy");
  one.gpus.pop_back();
  EXPECT_THAT(DoctorOn(one, "healthy").One("rails").fact,
              HasSubstr("first: GPU0 mlx5_0+mlx5_1; no NIC"));
  EXPECT_THAT(RailWarnings(Doctor(kSwitchPair, "healthy")), IsEmpty());
  // No GPU: no rails to speak of.
  EXPECT_THAT(Doctor("nic_no_gpu", "no_gpu").All("rails"), IsEmpty());
}

TEST(DoctorTest, SharingForcedByTheNicFilterIsNoRailWarning) {
  // mlx5_0 denied: GPU0 and GPU1 share mlx5_1, and the only nearer NIC is the denied one.
  DoctorRun deny = DoctorOn(LoadMachine(kDgx8), "healthy", Filter({}, {"mlx5_0"}));
  ASSERT_THAT(deny.plan.nics[1].gpus, ::testing::ElementsAre(0, 1));
  EXPECT_THAT(RailWarnings(deny), IsEmpty());
  EXPECT_EQ(deny.One("rails").severity, Severity::kOk);
  EXPECT_EQ(deny.One("nic mlx5_1").fact, "mlx5_1 serves GPU0, GPU1: they share its bandwidth");
  // Only mlx5_4 allowed: every GPU on it, every other NIC excluded.
  DoctorRun allow = DoctorOn(LoadMachine(kDgx8), "healthy", Filter({"mlx5_4"}, {}));
  EXPECT_THAT(RailWarnings(allow), IsEmpty());
}

TEST(DoctorTest, SharedNicWhileAnEqualOneIdlesWarns) {
  // A DGX missing GPUs 0000:99:00.0 and 0000:b9:00.0, with GPU4's own NICs denied: GPU4
  // takes mlx5_6 of the two NODE NICs (by name), then the GPU under mlx5_6 (0000:b5:00.0,
  // now GPU5) has only mlx5_6 near it, and mlx5_7 serves no GPU. (With all 8 GPUs no
  // allow/deny set gets here: each GPU then has an equal NIC nobody else prefers.)
  Machine m = LoadMachine(kDgx8);
  ASSERT_EQ(m.gpus.size(), 8u);
  m.gpus.erase(m.gpus.begin() + 7);
  m.gpus.erase(m.gpus.begin() + 5);
  DoctorRun run = DoctorOn(m, "healthy", Filter({}, {"mlx5_4", "mlx5_5"}));
  Finding shared = run.Expect("rails mlx5_6", Severity::kWarn,
                              "mlx5_6 is shared by GPU4 (0000:95:00.0), GPU5 (0000:b5:00.0) "
                              "while mlx5_7 (NODE to GPU4, like mlx5_6) serves no GPU");
  EXPECT_EQ(shared.remedy,
            "check nics.allow / nics.deny: GPU4 could use mlx5_4 (PIX, excluded by nics.deny), "
            "mlx5_5 (PXB, excluded by nics.deny); the planner should have used mlx5_7: report "
            "it with `ferryctl topo --json`");
  EXPECT_THAT(RailWarnings(run), ::testing::SizeIs(1));
  EXPECT_THAT(run.All("rails"), IsEmpty());  // no all-clear beside a warning
}

TEST(DoctorTest, HandMadeWrongPlansWarn) {
  const Machine m = LoadMachine(kDgx8);
  // A plan that puts GPU0 on the NIC nics.deny excluded: no fabric, so not where its bytes go.
  config::Config deny = Filter({}, {"mlx5_0"});
  absl::StatusOr<TopologyPlan> excluded = BuildPlan(m, deny.nics, deny.policy);
  ASSERT_TRUE(excluded.ok()) << excluded.status();
  excluded->gpus[0].nic = 0;
  excluded->gpus[0].path = config::PathClass::kPix;
  excluded->nics[0].gpus = {0};
  excluded->nics[1].gpus = {1};
  DoctorRun run{m, *excluded,
                RunDoctor(m, *excluded, SysRoot(SysFixture("healthy")), UnknownProbes(), deny)};
  Finding gpu0 = run.Expect("rails gpu0", Severity::kWarn,
                            "GPU0 (0000:15:00.0) is planned on mlx5_0 (excluded by nics.deny), "
                            "but its traffic has no NIC to leave through");
  EXPECT_THAT(gpu0.remedy, HasSubstr("a ferry bug"));
  EXPECT_THAT(RailWarnings(run), ::testing::SizeIs(1));

  // GPU1 moved from its PIX mlx5_1 onto GPU0's mlx5_0 (PXB), leaving mlx5_1 idle.
  absl::StatusOr<TopologyPlan> moved = BuildPlan(m, config::NicFilter(), config::Policy());
  ASSERT_TRUE(moved.ok()) << moved.status();
  moved->gpus[1].nic = 0;
  moved->gpus[1].path = config::PathClass::kPxb;
  moved->nics[0].gpus = {0, 1};
  moved->nics[1].gpus = {};
  run = DoctorRun{m, *moved, RunDoctor(m, *moved, SysRoot(SysFixture("healthy")), UnknownProbes())};
  Finding shared = run.Expect("rails mlx5_0", Severity::kWarn,
                              "mlx5_0 is shared by GPU0 (0000:15:00.0), GPU1 (0000:19:00.0) "
                              "while mlx5_1 (PIX to GPU1, nearer than mlx5_0's PXB) serves no "
                              "GPU");
  EXPECT_EQ(shared.remedy,
            "the planner should have used mlx5_1: report it with `ferryctl topo --json`");
  EXPECT_THAT(run.All("rails gpu1"), IsEmpty());  // mlx5_0 does carry GPU1's traffic
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
  // The probe opens the NIC it is named, and says which one it asked.
  SupportProbe nic = ProbeNicDmabuf("mlx5_0");
  EXPECT_THAT(nic.detail, ::testing::StartsWith("mlx5_0: "));
  SupportProbe missing = ProbeNicDmabuf("no_such_nic9");
  EXPECT_EQ(missing.state, SupportProbe::State::kUnknown);
  // No RDMA in the kernel (rdma-core answers NULL with ENOSYS), or not among those listed.
  EXPECT_THAT(missing.detail, ::testing::AnyOf(HasSubstr("no RDMA devices"),
                                               HasSubstr("not among the")));
  SupportProbe gpu = ProbeGpuDmabuf();
  EXPECT_THAT(gpu.detail, Not(IsEmpty()));
  // RLIMIT_MEMLOCK as getrlimit reports it for this process.
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &limit), 0);
  MemlockLimit memlock = ProbeMemlock();
  EXPECT_EQ(memlock.soft_bytes.has_value(), limit.rlim_cur != RLIM_INFINITY);
  if (memlock.soft_bytes) {
    EXPECT_EQ(*memlock.soft_bytes, limit.rlim_cur);
  }
}

}  // namespace
}  // namespace ferry::topology
