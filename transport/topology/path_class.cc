#include "transport/topology/path_class.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry::topology {
namespace {

using config::PathClass;

// Node indices from `node` up to its root, `node` first.
std::vector<int> Ancestry(const Machine& machine, int node) {
  std::vector<int> chain;
  for (int n = node; n >= 0; n = machine.pci_nodes[n].parent) chain.push_back(n);
  return chain;
}

int RootNuma(const Machine& machine, const std::vector<int>& chain) {
  return chain.empty() ? -1 : machine.pci_nodes[chain.back()].numa;
}

}  // namespace

PciPath ClassifyPath(const Machine& machine, int node_a, int node_b) {
  PciPath result;
  if (node_a < 0 || node_b < 0) return result;  // not on PCI at all: nothing shared
  std::vector<int> up_a = Ancestry(machine, node_a);
  std::vector<int> up_b = Ancestry(machine, node_b);
  // Position of the lowest common ancestor in each chain.
  int lca_a = -1, lca_b = -1;
  for (size_t i = 0; i < up_a.size() && lca_a < 0; ++i) {
    auto it = std::find(up_b.begin(), up_b.end(), up_a[i]);
    if (it != up_b.end()) {
      lca_a = static_cast<int>(i);
      lca_b = static_cast<int>(it - up_b.begin());
    }
  }
  if (lca_a < 0) {
    // Different root complexes: the NUMA node decides whether traffic crosses sockets.
    int numa_a = RootNuma(machine, up_a), numa_b = RootNuma(machine, up_b);
    result.path_class =
        (numa_a >= 0 && numa_a == numa_b) ? PathClass::kNode : PathClass::kSys;
    return result;
  }
  // Bridges strictly between each device and the ancestor (the devices themselves are
  // chain[0]; a device that is itself a bridge's parent cannot happen for endpoints).
  auto collect = [&](const std::vector<int>& chain, int lca_pos) {
    int count = 0;
    for (int i = 1; i < lca_pos; ++i) {
      if (machine.pci_nodes[chain[i]].kind == PciNode::Kind::kBridge) {
        result.bridges.push_back(machine.pci_nodes[chain[i]].pci);
        ++count;
      }
    }
    return count;
  };
  int below_a = collect(up_a, lca_a);
  int below_b = collect(up_b, lca_b);
  const PciNode& ancestor = machine.pci_nodes[up_a[lca_a]];
  if (ancestor.kind == PciNode::Kind::kHostBridge) {
    result.path_class = PathClass::kPhb;
  } else if (below_a <= 1 && below_b <= 1) {
    result.path_class = PathClass::kPix;
  } else {
    result.path_class = PathClass::kPxb;
  }
  return result;
}

std::vector<std::vector<config::PathClass>> ComputePathMatrix(const Machine& machine) {
  std::vector<std::vector<PathClass>> matrix(machine.gpus.size());
  for (size_t g = 0; g < machine.gpus.size(); ++g) {
    for (const Nic& nic : machine.nics) {
      matrix[g].push_back(
          ClassifyPath(machine, machine.gpus[g].pci_node, nic.pci_node).path_class);
    }
  }
  return matrix;
}

std::string DescribePath(config::PathClass path_class, int numa_a, int numa_b) {
  switch (path_class) {
    case PathClass::kPix:
      return "behind one PCIe switch";
    case PathClass::kPxb:
      return "behind a tree of PCIe switches, not through the CPU";
    case PathClass::kPhb:
      return "through one CPU root complex";
    case PathClass::kNode:
      return absl::StrCat("across root complexes of NUMA node ", numa_a);
    case PathClass::kSys:
      if (numa_a < 0 || numa_b < 0) return "NUMA locality unknown, assumed different sockets";
      return absl::StrCat("different sockets: NUMA ", numa_a, " and ", numa_b);
  }
  return "";
}

}  // namespace ferry::topology
