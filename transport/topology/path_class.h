#pragma once
// The PCIe path class of a device pair (DESIGN.md, "transport/topology"), nvidia-smi's
// legend: with A the lowest common ancestor of the two devices in the PCIe tree,
//   A a PCI bridge and each device at most one bridge below A (one switch) -> PIX
//   A a PCI bridge otherwise                                               -> PXB
//   A a host bridge (one root complex)                                     -> PHB
//   no common PCI ancestor, same NUMA node                                 -> NODE
//   different (or unknown) NUMA nodes                                      -> SYS

#include <string>
#include <vector>

#include "config/policy.h"
#include "transport/topology/machine.h"

namespace ferry::topology {

struct PciPath {
  config::PathClass path_class = config::PathClass::kSys;
  // PCI-PCI bridges strictly below the common ancestor on either side, device side first.
  // Peer-to-peer traffic turns around at the ancestor, so these are the ports whose ACS
  // redirect would force it up to the root complex instead.
  std::vector<std::string> bridges;
};

// Classifies the path between two nodes of `machine.pci_nodes`.
PciPath ClassifyPath(const Machine& machine, int node_a, int node_b);

// path_classes[gpu][nic] for every GPU-NIC pair of the machine.
std::vector<std::vector<config::PathClass>> ComputePathMatrix(const Machine& machine);

// A few words saying what the class means for this pair, e.g. "different sockets: NUMA
// 0 and 1"; used inside decision reasons.
std::string DescribePath(config::PathClass path_class, int numa_a, int numa_b);

}  // namespace ferry::topology
