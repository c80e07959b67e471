#pragma once
// The discovered machine: GPUs, RDMA NICs and the PCIe tree between them, as plain data.
// Nothing here refers to hwloc, so the planner is a pure function of this model and tests
// (or the agent, from a saved file) can build one without a live machine.

#include <optional>
#include <string>
#include <vector>

namespace ferry::topology {

// One node of the PCIe tree. Host bridges (root complexes) are roots; `parent` links up.
struct PciNode {
  enum class Kind { kHostBridge, kBridge, kDevice };
  Kind kind = Kind::kDevice;
  // "0000:3b:00.0"; for host bridges the bus range hwloc reports, e.g. "0000:[00-7f]".
  std::string pci;
  int parent = -1;  // index into Machine::pci_nodes, -1 for host bridges
  // The NUMA node the root complex is attached to; -1 when hwloc could not tell.
  int numa = -1;
};

struct Gpu {
  int index = 0;            // position in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)
  std::string pci;          // "0000:3b:00.0"
  std::string model;        // hwloc's PCIDevice info when present, e.g. "H100"
  int numa = -1;
  int pci_node = -1;        // index into Machine::pci_nodes
  int cuda_ordinal = -1;    // -1 when CUDA is absent or does not see this GPU
};

struct NicPort {
  int number = 1;
  // "ACTIVE", "DOWN", "INIT", ... ; "" when unknown.
  std::string state;
  std::string link_layer;   // "InfiniBand" / "Ethernet" / "" when unknown
  double rate_gbps = 0;     // 0 when unknown
  bool Active() const { return state == "ACTIVE"; }
};

struct Nic {
  std::string name;         // "mlx5_0"
  std::string pci;
  int numa = -1;
  int pci_node = -1;
  double pci_link_gbytes = 0;  // PCIe link speed hwloc measured, GB/s; 0 when unknown
  std::vector<NicPort> ports;  // empty when port state is unknown

  // A NIC whose ports are all known and none is active cannot carry traffic. Unknown
  // state (an XML file without port infos) counts as usable: we cannot tell otherwise.
  bool Usable() const;
  // The best known port rate, Gb/s (0 when unknown).
  double RateGbps() const;
};

struct Machine {
  // Where the model came from: "live" or the topology file's path.
  std::string source;
  std::vector<PciNode> pci_nodes;
  std::vector<Gpu> gpus;    // sorted by PCI address
  std::vector<Nic> nics;    // sorted by name

  // Index of the NIC named `name`, or nullopt.
  std::optional<int> FindNic(const std::string& name) const;
};

// Parses the numeric form of a PCI address ("0000:3b:00.0") into a sortable key.
// Returns false on malformed text.
bool ParsePciAddress(const std::string& text, unsigned* domain, unsigned* bus,
                     unsigned* device, unsigned* function);

// Orders PCI addresses numerically (domain, bus, device, function), falling back to text.
bool PciLess(const std::string& a, const std::string& b);

}  // namespace ferry::topology
