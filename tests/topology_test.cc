// Discovery from hwloc XML fixtures and the path class of every GPU-NIC pair.
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/policy.h"
#include "transport/topology/acs.h"
#include "transport/topology/discovery.h"
#include "transport/topology/nic_address.h"
#include "transport/topology/machine.h"
#include "transport/topology/path_class.h"
#include "transport/topology/sys_root.h"

namespace ferry::topology {
namespace {

using config::PathClass;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Fixture(const std::string& name) {
  return std::string(FERRY_FIXTURES) + "/topology/" + name + ".xml";
}

std::string SysFixture(const std::string& name) {
  return std::string(FERRY_FIXTURES) + "/sysfs/" + name;
}

Machine Load(const std::string& name) {
  absl::StatusOr<Machine> machine = DiscoverMachine(Fixture(name));
  EXPECT_TRUE(machine.ok()) << machine.status();
  return machine.ok() ? *machine : Machine();
}

// `name` with NIC ports (and virtual NICs) from the sysfs tree `tree`; nullopt on failure.
std::optional<Machine> LoadWithSysfs(const std::string& name, const std::string& tree) {
  DiscoveryOptions options;
  options.xml_path = Fixture(name);
  options.sys_root = SysFixture(tree);
  absl::StatusOr<Machine> machine = DiscoverMachine(options);
  EXPECT_TRUE(machine.ok()) << machine.status();
  if (!machine.ok()) return std::nullopt;
  return *std::move(machine);
}

// The matrix as strings, rows = GPUs, columns = NICs, for compact assertions.
std::vector<std::string> Matrix(const Machine& machine) {
  std::vector<std::string> rows;
  for (const auto& row : ComputePathMatrix(machine)) {
    std::string text;
    for (PathClass p : row) text += std::string(text.empty() ? "" : " ") + PathClassName(p);
    rows.push_back(text);
  }
  return rows;
}

TEST(DiscoveryTest, DualSocketGpuAndNicOnDifferentSockets) {
  Machine m = Load("dual_socket_sys");
  EXPECT_EQ(m.source, Fixture("dual_socket_sys"));
  ASSERT_EQ(m.gpus.size(), 1u);
  EXPECT_EQ(m.gpus[0].pci, "0000:3b:00.0");
  EXPECT_EQ(m.gpus[0].numa, 0);
  EXPECT_EQ(m.gpus[0].index, 0);
  EXPECT_EQ(m.gpus[0].model, "H100");
  EXPECT_EQ(m.gpus[0].cuda_ordinal, -1);  // files describe other machines: no CUDA lookup
  ASSERT_EQ(m.nics.size(), 1u);
  EXPECT_EQ(m.nics[0].name, "mlx5_0");
  EXPECT_EQ(m.nics[0].pci, "0000:86:00.0");
  EXPECT_EQ(m.nics[0].numa, 1);
  // Port state from the file's hwloc infos ("Port1State" = 4).
  ASSERT_EQ(m.nics[0].ports.size(), 1u);
  EXPECT_EQ(m.nics[0].ports[0].state, "ACTIVE");
  EXPECT_TRUE(m.nics[0].Usable());
  EXPECT_THAT(Matrix(m), ElementsAre("SYS"));
}

TEST(DiscoveryTest, EightGpuServerIsInBusOrderWithEveryClass) {
  Machine m = Load("dgx8_switches");
  ASSERT_EQ(m.gpus.size(), 8u);
  std::vector<std::string> pcis;
  for (const Gpu& g : m.gpus) pcis.push_back(g.pci);
  EXPECT_THAT(pcis, ElementsAre("0000:15:00.0", "0000:19:00.0", "0000:35:00.0",
                                "0000:39:00.0", "0000:95:00.0", "0000:99:00.0",
                                "0000:b5:00.0", "0000:b9:00.0"));
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(m.gpus[i].index, i);
    EXPECT_EQ(m.gpus[i].numa, i < 4 ? 0 : 1);
  }
  ASSERT_EQ(m.nics.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(m.nics[i].name, "mlx5_" + std::to_string(i));
  // GPU i shares a leaf switch with mlx5_i (PIX), the other leaf of its tree is PXB, the
  // other root complex of its socket NODE, the other socket SYS.
  EXPECT_THAT(Matrix(m), ElementsAre("PIX PXB NODE NODE SYS SYS SYS SYS",
                                     "PXB PIX NODE NODE SYS SYS SYS SYS",
                                     "NODE NODE PIX PXB SYS SYS SYS SYS",
                                     "NODE NODE PXB PIX SYS SYS SYS SYS",
                                     "SYS SYS SYS SYS PIX PXB NODE NODE",
                                     "SYS SYS SYS SYS PXB PIX NODE NODE",
                                     "SYS SYS SYS SYS NODE NODE PIX PXB",
                                     "SYS SYS SYS SYS NODE NODE PXB PIX"));
}

TEST(DiscoveryTest, SeveralRootComplexesOnOneSocketAreNode) {
  Machine m = Load("single_socket_node");
  ASSERT_EQ(m.gpus.size(), 1u);
  ASSERT_EQ(m.nics.size(), 3u);
  EXPECT_EQ(m.nics[0].name, "mlx5_0");
  EXPECT_EQ(m.nics[2].name, "mlx5_2");
  EXPECT_THAT(Matrix(m), ElementsAre("NODE NODE PHB"));
  // mlx5_2's only port is DOWN in the file.
  EXPECT_FALSE(m.nics[2].Usable());
  EXPECT_EQ(m.nics[2].ports[0].state, "DOWN");
  EXPECT_GT(m.nics[1].pci_link_gbytes, m.nics[0].pci_link_gbytes);
}

TEST(DiscoveryTest, SwitchPairAndFarNic) {
  Machine m = Load("switch_pair_far_nic");
  ASSERT_EQ(m.gpus.size(), 2u);
  EXPECT_THAT(Matrix(m), ElementsAre("PIX PIX SYS", "PIX PIX SYS"));
  // The path's bridges are the switch's downstream ports, not its upstream port.
  PciPath path = ClassifyPath(m, m.gpus[0].pci_node, m.nics[0].pci_node);
  EXPECT_EQ(path.path_class, PathClass::kPix);
  EXPECT_THAT(path.bridges, ElementsAre("0000:18:00.0", "0000:18:02.0"));
  EXPECT_TRUE(ClassifyPath(m, m.gpus[0].pci_node, m.nics[2].pci_node).bridges.empty());
}

TEST(DiscoveryTest, RootPortsOfOneRootComplexArePhb) {
  Machine m = Load("root_ports_phb");
  ASSERT_EQ(m.gpus.size(), 1u);
  EXPECT_EQ(m.gpus[0].model, "A100");
  EXPECT_THAT(Matrix(m), ElementsAre("PHB"));
  PciPath path = ClassifyPath(m, m.gpus[0].pci_node, m.nics[0].pci_node);
  EXPECT_THAT(path.bridges, ElementsAre("0000:00:01.1", "0000:00:03.1"));
}

TEST(DiscoveryTest, OnlyNvidiaDisplayAndThreeDControllersAreGpus) {
  Machine m = Load("gpu_no_nic");
  ASSERT_EQ(m.gpus.size(), 1u);  // the AMD card at 03:00.0 is not ours
  EXPECT_EQ(m.gpus[0].pci, "0000:01:00.0");
  EXPECT_TRUE(m.nics.empty());  // eth0 is not an RDMA device
}

TEST(DiscoveryTest, SysfsPortsOverrideTheFile) {
  DiscoveryOptions options;
  options.xml_path = Fixture("single_socket_node");
  options.sys_root = SysFixture("healthy");
  absl::StatusOr<Machine> m = DiscoverMachine(options);
  ASSERT_TRUE(m.ok()) << m.status();
  const Nic& nic = m->nics[2];
  ASSERT_EQ(nic.ports.size(), 1u);
  EXPECT_EQ(nic.ports[0].state, "ACTIVE");
  EXPECT_EQ(nic.ports[0].link_layer, "InfiniBand");
  EXPECT_EQ(nic.ports[0].rate_gbps, 400);
  EXPECT_EQ(nic.RateGbps(), 400);
  EXPECT_TRUE(nic.Usable());
}

TEST(DiscoveryTest, VirtualRdmaDevicesHwlocHidesComeFromSysfs) {
  // Soft-RoCE's rxe0 is in /sys/class/infiniband but not in hwloc's topology (no PCI
  // parent): rdma-core opens it, so the inventory must list it too (issue 43 item 2).
  std::optional<Machine> m = LoadWithSysfs("gpu_no_nic", "soft_roce");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->nics.size(), 1u);
  const Nic& rxe = m->nics[0];
  EXPECT_EQ(rxe.name, "rxe0");
  EXPECT_EQ(rxe.pci, "");
  EXPECT_EQ(rxe.pci_node, -1);
  ASSERT_EQ(rxe.ports.size(), 1u);
  EXPECT_EQ(rxe.ports[0].state, "ACTIVE");
  EXPECT_EQ(rxe.ports[0].link_layer, "Ethernet");
  EXPECT_EQ(rxe.RateGbps(), 10);
  // A file alone describes some other machine: this one's sysfs adds nothing to it.
  EXPECT_TRUE(Load("gpu_no_nic").nics.empty());
}

TEST(DiscoveryTest, ANicHwlocListsIsNotAddedAgainFromSysfs) {
  std::optional<Machine> m = LoadWithSysfs("nic_no_gpu", "no_gpu");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->nics.size(), 1u);
  EXPECT_EQ(m->nics[0].name, "mlx5_0");
  EXPECT_NE(m->nics[0].pci, "");
}

TEST(DiscoveryTest, LiveMachineLoads) {
  // This machine may or may not have GPUs; discovery must still succeed and be ordered.
  absl::StatusOr<Machine> m = DiscoverMachine(std::string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->source, "live");
  for (size_t i = 0; i < m->gpus.size(); ++i) EXPECT_EQ(m->gpus[i].index, static_cast<int>(i));
}

TEST(DiscoveryTest, MissingFileNamesIt) {
  absl::StatusOr<Machine> m = DiscoverMachine(std::string("/nonexistent/topo.xml"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("/nonexistent/topo.xml"));
}

TEST(DiscoveryTest, MalformedFileNamesIt) {
  std::string path = ::testing::TempDir() + "/malformed_topology.xml";
  {
    std::ofstream out(path);
    out << "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n  <object type=\"Mach";
  }
  absl::StatusOr<Machine> m = DiscoverMachine(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr(path));
  EXPECT_THAT(m.status().message(), HasSubstr("not a valid hwloc XML topology"));
}

TEST(MachineTest, PciAndNameOrdering) {
  EXPECT_TRUE(PciLess("0000:1a:00.0", "0000:9b:00.0"));
  EXPECT_TRUE(PciLess("0000:9b:00.0", "0001:00:00.0"));
  EXPECT_TRUE(PciLess("0000:3b:00.0", "0000:3b:00.1"));
  EXPECT_FALSE(PciLess("0000:3b:00.0", "0000:3b:00.0"));
  EXPECT_TRUE(NaturalLess("mlx5_2", "mlx5_10"));
  EXPECT_FALSE(NaturalLess("mlx5_10", "mlx5_2"));
  EXPECT_TRUE(NaturalLess("mlx5_0", "mlx5_1"));
  EXPECT_TRUE(NaturalLess("ibp1", "mlx5_0"));
}

TEST(MachineTest, NicUsability) {
  Nic nic;
  EXPECT_TRUE(nic.Usable());  // unknown ports: assume usable
  nic.ports = {{1, "DOWN", "", 0}, {2, "DOWN", "", 0}};
  EXPECT_FALSE(nic.Usable());
  nic.ports[1] = {2, "ACTIVE", "Ethernet", 100};
  EXPECT_TRUE(nic.Usable());
  EXPECT_EQ(nic.RateGbps(), 100);
}

TEST(PathClassTest, HandBuiltTreeCoversEveryRule) {
  // host0 (NUMA 0) - rp0 - sw_up - sw_dn0 - a
  //                              - sw_dn1 - b
  //                              - sw_dn2 - sub_up - sub_dn - c
  //                - rp1 - d
  // host1 (NUMA 0) - rp2 - e
  // host2 (NUMA 1) - rp3 - f
  Machine m;
  auto add = [&](PciNode::Kind kind, const char* pci, int parent, int numa) {
    m.pci_nodes.push_back({kind, pci, parent, numa});
    return static_cast<int>(m.pci_nodes.size()) - 1;
  };
  using K = PciNode::Kind;
  int host0 = add(K::kHostBridge, "0000:[00-3f]", -1, 0);
  int rp0 = add(K::kBridge, "0000:00:01.0", host0, 0);
  int sw_up = add(K::kBridge, "0000:01:00.0", rp0, 0);
  int dn0 = add(K::kBridge, "0000:02:00.0", sw_up, 0);
  int dn1 = add(K::kBridge, "0000:02:01.0", sw_up, 0);
  int dn2 = add(K::kBridge, "0000:02:02.0", sw_up, 0);
  int sub_up = add(K::kBridge, "0000:05:00.0", dn2, 0);
  int sub_dn = add(K::kBridge, "0000:06:00.0", sub_up, 0);
  int a = add(K::kDevice, "0000:03:00.0", dn0, 0);
  int b = add(K::kDevice, "0000:04:00.0", dn1, 0);
  int c = add(K::kDevice, "0000:07:00.0", sub_dn, 0);
  int rp1 = add(K::kBridge, "0000:00:02.0", host0, 0);
  int d = add(K::kDevice, "0000:10:00.0", rp1, 0);
  int host1 = add(K::kHostBridge, "0000:[40-7f]", -1, 0);
  int e = add(K::kDevice, "0000:41:00.0", add(K::kBridge, "0000:40:01.0", host1, 0), 0);
  int host2 = add(K::kHostBridge, "0000:[80-ff]", -1, 1);
  int f = add(K::kDevice, "0000:81:00.0", add(K::kBridge, "0000:80:01.0", host2, 1), 1);
  int host3 = add(K::kHostBridge, "0000:[c0-ff]", -1, -1);
  int g = add(K::kDevice, "0000:c1:00.0", host3, -1);

  EXPECT_EQ(ClassifyPath(m, a, b).path_class, PathClass::kPix);
  EXPECT_EQ(ClassifyPath(m, a, c).path_class, PathClass::kPxb);  // c is 3 bridges below
  EXPECT_THAT(ClassifyPath(m, a, c).bridges,
              ElementsAre("0000:02:00.0", "0000:06:00.0", "0000:05:00.0", "0000:02:02.0"));
  EXPECT_EQ(ClassifyPath(m, a, d).path_class, PathClass::kPhb);
  EXPECT_EQ(ClassifyPath(m, a, e).path_class, PathClass::kNode);
  EXPECT_EQ(ClassifyPath(m, a, f).path_class, PathClass::kSys);
  EXPECT_EQ(ClassifyPath(m, a, g).path_class, PathClass::kSys);  // unknown NUMA
  EXPECT_EQ(ClassifyPath(m, a, -1).path_class, PathClass::kSys);
  EXPECT_EQ(ClassifyPath(m, b, a).path_class, PathClass::kPix);  // symmetric
}

TEST(PathClassTest, Descriptions) {
  EXPECT_EQ(DescribePath(PathClass::kPix, 0, 0), "behind one PCIe switch");
  EXPECT_EQ(DescribePath(PathClass::kNode, 0, 0), "across root complexes of NUMA node 0");
  EXPECT_EQ(DescribePath(PathClass::kSys, 0, 1), "different sockets: NUMA 0 and 1");
  EXPECT_EQ(DescribePath(PathClass::kSys, -1, 1),
            "NUMA locality unknown, assumed different sockets");
}

TEST(SysRootTest, ReadsUnderThePrefix) {
  SysRoot root(SysFixture("healthy") + "/");
  EXPECT_FALSE(root.is_live());
  EXPECT_EQ(root.ReadLine("/sys/module/nvidia_peermem/version"), "570.86.15");
  EXPECT_TRUE(root.Exists("/sys/class/iommu/dmar0"));
  EXPECT_FALSE(root.Exists("/sys/module/nope"));
  EXPECT_EQ(root.ReadLine("/nope"), std::nullopt);
  EXPECT_THAT(root.List("/sys/class/infiniband"), ElementsAre("mlx5_0", "mlx5_1", "mlx5_2"));
  EXPECT_TRUE(root.List("/nope").empty());
  EXPECT_TRUE(SysRoot("").is_live());
  EXPECT_EQ(SysRoot("/").Path("/proc/cmdline"), "/proc/cmdline");
}

// tcp rails derived from the NICs (`tcp.rails: auto`): a fake sysfs names each NIC's
// interface; the address is the live machine's (lo is 127.0.0.1 everywhere).
TEST(NicAddressTest, TheNicsInterfaceGivesTheRailItsAddress) {
  char tmpl[] = "/tmp/ferry-nic-address-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  std::filesystem::create_directories(root + "/sys/class/infiniband/mlx5_9/device/net/lo");
  std::filesystem::create_directories(root + "/sys/class/infiniband/mlx5_8/device");
  std::filesystem::create_directories(
      root + "/sys/class/infiniband/mlx5_7/device/net/ferry-no-such-if0");
  SysRoot sys(root);
  auto lo = NicAddress(sys, "mlx5_9");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(*lo, "127.0.0.1");
  auto none = NicAddress(sys, "mlx5_8");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("mlx5_8 has no network interface"));
  auto gone = NicAddress(sys, "mlx5_7");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(),
              HasSubstr("mlx5_7's interface ferry-no-such-if0 has no IPv4 address"));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace ferry::topology
