#include "transport/topology/discovery.h"

#include <hwloc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/topology/probes.h"
#include "transport/topology/sys_root.h"

namespace ferry::topology {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology_t topology) const noexcept {
    hwloc_topology_destroy(topology);
  }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

bool IsIo(hwloc_obj_t obj) {
  return obj->type == HWLOC_OBJ_BRIDGE || obj->type == HWLOC_OBJ_PCI_DEVICE;
}

std::string PciName(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  return absl::StrFormat("%04x:%02x:%02x.%x", pci.domain, pci.bus, pci.dev, pci.func);
}

// The NUMA node an I/O object is attached to: its first non-I/O ancestor's nodeset when
// that holds exactly one node.
int NumaOf(hwloc_topology_t topology, hwloc_obj_t obj) {
  hwloc_obj_t anchor = hwloc_get_non_io_ancestor_obj(topology, obj);
  if (anchor == nullptr || anchor->nodeset == nullptr) return -1;
  if (hwloc_bitmap_weight(anchor->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anchor->nodeset);
}

// IB port states as the kernel numbers them (include/rdma/ib_verbs.h ib_port_state).
std::string PortStateName(int state) {
  switch (state) {
    case 1: return "DOWN";
    case 2: return "INIT";
    case 3: return "ARMED";
    case 4: return "ACTIVE";
    case 5: return "ACTIVE_DEFER";
    default: return absl::StrCat("STATE_", state);
  }
}

class TreeBuilder {
 public:
  TreeBuilder(hwloc_topology_t topology, Machine& machine)
      : topology_(topology), machine_(machine) {}

  // Index of `obj` (a bridge or PCI device) in machine.pci_nodes, adding it and its
  // ancestors on first use.
  int NodeFor(hwloc_obj_t obj) {
    auto it = index_.find(obj);
    if (it != index_.end()) return it->second;
    PciNode node;
    int parent = (obj->parent != nullptr && IsIo(obj->parent)) ? NodeFor(obj->parent) : -1;
    node.parent = parent;
    if (obj->type == HWLOC_OBJ_BRIDGE &&
        obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
      node.kind = PciNode::Kind::kHostBridge;
      const auto& down = obj->attr->bridge.downstream.pci;
      node.pci = absl::StrFormat("%04x:[%02x-%02x]", down.domain, down.secondary_bus,
                                 down.subordinate_bus);
    } else {
      node.kind = obj->type == HWLOC_OBJ_BRIDGE ? PciNode::Kind::kBridge
                                                : PciNode::Kind::kDevice;
      node.pci = PciName(obj->attr->pcidev);
    }
    node.numa = parent >= 0 ? machine_.pci_nodes[parent].numa : NumaOf(topology_, obj);
    machine_.pci_nodes.push_back(node);
    int index = static_cast<int>(machine_.pci_nodes.size()) - 1;
    index_[obj] = index;
    return index;
  }

 private:
  hwloc_topology_t topology_;
  Machine& machine_;
  std::map<hwloc_obj_t, int> index_;
};

// Port infos hwloc's Linux backend stores on OpenFabrics devices ("Port1State" = "4").
std::vector<NicPort> PortsFromInfos(hwloc_obj_t osdev) {
  std::vector<NicPort> ports;
  for (unsigned i = 0; i < osdev->infos_count; ++i) {
    absl::string_view name = osdev->infos[i].name;
    if (!absl::StartsWith(name, "Port") || !absl::EndsWith(name, "State")) continue;
    int number = 0, state = 0;
    if (!absl::SimpleAtoi(name.substr(4, name.size() - 9), &number) ||
        !absl::SimpleAtoi(osdev->infos[i].value, &state)) {
      continue;
    }
    NicPort port;
    port.number = number;
    port.state = PortStateName(state);
    ports.push_back(port);
  }
  return ports;
}

// /sys/class/infiniband/<nic>/ports/<n>/{state,link_layer,rate}; empty when absent.
std::vector<NicPort> PortsFromSysfs(const SysRoot& root, const std::string& nic) {
  std::vector<NicPort> ports;
  std::string dir = absl::StrCat("/sys/class/infiniband/", nic, "/ports");
  for (const std::string& entry : root.List(dir)) {
    NicPort port;
    if (!absl::SimpleAtoi(entry, &port.number)) continue;
    std::string base = absl::StrCat(dir, "/", entry, "/");
    // "4: ACTIVE" -> "ACTIVE".
    std::string state = root.ReadLine(base + "state").value_or("");
    size_t colon = state.find(": ");
    port.state = colon == std::string::npos ? state : state.substr(colon + 2);
    port.link_layer = root.ReadLine(base + "link_layer").value_or("");
    // "200 Gb/sec (4X HDR)" -> 200.
    std::string rate = root.ReadLine(base + "rate").value_or("");
    if (!absl::SimpleAtod(rate.substr(0, rate.find(' ')), &port.rate_gbps)) port.rate_gbps = 0;
    ports.push_back(port);
  }
  std::sort(ports.begin(), ports.end(),
            [](const NicPort& a, const NicPort& b) { return a.number < b.number; });
  return ports;
}

// RDMA devices sysfs lists that hwloc did not: hwloc's Linux backend leaves out OS devices
// with no physical parent (Soft-RoCE rxe, siw) unless HWLOC_VIRTUAL_LINUX_OSDEV=1 is set
// (hwloc's documented environment variable; seen on rxe0 in make test-rdma's guests), yet
// rdma-core opens them like any other. They join the inventory without a PCI path: they
// carry host memory, never GPU memory (plan.h says why).
void AddSysfsOnlyNics(const SysRoot& sys, Machine& machine) {
  for (const std::string& name : sys.List("/sys/class/infiniband")) {
    // A `device` link means a physical parent, which hwloc shows (a tree of another
    // machine's NICs, as doctor's --sysfs-root may name, adds nothing either).
    if (machine.FindNic(name) || sys.LinkTarget(absl::StrCat("/sys/class/infiniband/", name,
                                                             "/device"))) {
      continue;
    }
    Nic nic;
    nic.name = name;
    nic.ports = PortsFromSysfs(sys, name);
    machine.nics.push_back(std::move(nic));
  }
}

bool IsNvidiaGpu(hwloc_obj_t obj) {
  const auto& pci = obj->attr->pcidev;
  // 0x0300 VGA-compatible, 0x0302 3D controller (data-centre GPUs have no display).
  return pci.vendor_id == 0x10de && (pci.class_id == 0x0300 || pci.class_id == 0x0302);
}

}  // namespace

bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      unsigned long long x = std::strtoull(a.substr(i, ei - i).c_str(), nullptr, 10);
      unsigned long long y = std::strtoull(b.substr(j, ej - j).c_str(), nullptr, 10);
      if (x != y) return x < y;
      i = ei;
      j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

absl::StatusOr<Machine> DiscoverMachine(const DiscoveryOptions& options) {
  const bool live = options.xml_path.empty();
  if (!live) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(options.xml_path, ec)) {
      return absl::NotFoundError(
          absl::StrCat("topology file ", options.xml_path, ": no such file"));
    }
  }
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    return absl::ErrnoToStatus(errno, "hwloc_topology_init");
  }
  TopologyPtr topology(raw);
  // hwloc drops PCI objects unless asked to keep them; KEEP_ALL also keeps the bridges
  // that the path class is computed from.
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (!live && hwloc_topology_set_xml(raw, options.xml_path.c_str()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology file ", options.xml_path, ": hwloc cannot read it as XML"));
  }
  if (hwloc_topology_load(raw) != 0) {
    if (!live) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology file ", options.xml_path,
          ": not a valid hwloc XML topology (write one with `lstopo --of xml FILE`)"));
    }
    return absl::ErrnoToStatus(errno, "hwloc_topology_load (live machine)");
  }

  Machine machine;
  machine.source = live ? "live" : options.xml_path;
  TreeBuilder tree(raw, machine);

  for (hwloc_obj_t obj = hwloc_get_next_pcidev(raw, nullptr); obj != nullptr;
       obj = hwloc_get_next_pcidev(raw, obj)) {
    if (!IsNvidiaGpu(obj)) continue;
    Gpu gpu;
    gpu.pci = PciName(obj->attr->pcidev);
    gpu.pci_node = tree.NodeFor(obj);
    gpu.numa = machine.pci_nodes[gpu.pci_node].numa;
    if (const char* model = hwloc_obj_get_info_by_name(obj, "PCIDevice")) gpu.model = model;
    machine.gpus.push_back(gpu);
  }

  std::optional<SysRoot> sys;
  if (options.sys_root) {
    sys.emplace(*options.sys_root);
  } else if (live) {
    sys.emplace("/");
  }
  for (hwloc_obj_t obj = hwloc_get_next_osdev(raw, nullptr); obj != nullptr;
       obj = hwloc_get_next_osdev(raw, obj)) {
    if (obj->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || obj->name == nullptr) continue;
    Nic nic;
    nic.name = obj->name;
    hwloc_obj_t pci = obj->parent;
    if (pci != nullptr && pci->type == HWLOC_OBJ_PCI_DEVICE) {
      nic.pci = PciName(pci->attr->pcidev);
      nic.pci_node = tree.NodeFor(pci);
      nic.numa = machine.pci_nodes[nic.pci_node].numa;
      nic.pci_link_gbytes = pci->attr->pcidev.linkspeed;
    } else {
      // A NIC without a PCI parent (virtual device): no PCIe path to anything.
      nic.numa = NumaOf(raw, obj);
    }
    if (sys) nic.ports = PortsFromSysfs(*sys, nic.name);
    if (nic.ports.empty()) nic.ports = PortsFromInfos(obj);
    machine.nics.push_back(nic);
  }
  if (sys) AddSysfsOnlyNics(*sys, machine);

  std::sort(machine.gpus.begin(), machine.gpus.end(),
            [](const Gpu& a, const Gpu& b) { return PciLess(a.pci, b.pci); });
  std::sort(machine.nics.begin(), machine.nics.end(),
            [](const Nic& a, const Nic& b) { return NaturalLess(a.name, b.name); });
  // CUDA numbers devices by PCI bus id under CUDA_DEVICE_ORDER=PCI_BUS_ID; on the live
  // machine ask CUDA itself so the ordinal is the one applications will use.
  std::vector<std::string> cuda_ids = live ? CudaPciBusIds() : std::vector<std::string>();
  for (size_t i = 0; i < machine.gpus.size(); ++i) {
    Gpu& gpu = machine.gpus[i];
    gpu.index = static_cast<int>(i);
    for (size_t c = 0; c < cuda_ids.size(); ++c) {
      if (absl::EqualsIgnoreCase(cuda_ids[c], gpu.pci)) gpu.cuda_ordinal = static_cast<int>(c);
    }
  }
  return machine;
}

absl::StatusOr<Machine> DiscoverMachine(const std::string& xml_path) {
  DiscoveryOptions options;
  options.xml_path = xml_path;
  return DiscoverMachine(options);
}

}  // namespace ferry::topology
