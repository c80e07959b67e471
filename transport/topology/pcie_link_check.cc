// A PCIe link that trained below what both of its ends support caps every transfer through
// it: a card not fully seated or in a slot wired for fewer lanes, a riser, a BIOS that
// forces an older generation, or power saving that slowed a link down. Troubleshooting
// guides start here (`lspci -vv`: LnkSta against LnkCap); sysfs has both, as
// current_link_speed/width and max_link_speed/width of each device.
//
// A link joins a device to the port above it, and each end's maximum is only what that end
// supports (a Gen4 NIC in a Gen5 slot leaves the port at 16 of 32 GT/s, correctly), so a
// link is expected to run at the lower of its two ends' maximums. Going up from a device
// the links alternate: device - port above it, then inside a switch no link, then the
// switch's upstream port - the port above the switch, and so on.
//
// NVIDIA GPUs lower their link speed when idle (to 2.5 GT/s), so a GPU's own link at full
// width but lower speed is mentioned, not warned about.
#include <algorithm>
#include <cstdlib>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "transport/topology/doctor_checks.h"
#include "transport/topology/path_class.h"

namespace ferry::topology {
namespace {

struct LinkState {
  double speed = 0, max_speed = 0;  // GT/s
  int width = 0, max_width = 0;     // lanes
};

// "16.0 GT/s PCIe" (or "8 GT/s" on older kernels) -> 16; 0 for "Unknown" and the like.
double ReadSpeed(const SysRoot& root, const std::string& file) {
  std::string text = root.ReadLine(file).value_or("");
  return std::strtod(text.c_str(), nullptr);
}

int ReadWidth(const SysRoot& root, const std::string& file) {
  std::string text = root.ReadLine(file).value_or("");
  return std::atoi(text.c_str());
}

// nullopt unless all four files are there and make sense.
std::optional<LinkState> ReadLink(const SysRoot& root, const std::string& pci) {
  const std::string dir = absl::StrCat("/sys/bus/pci/devices/", pci, "/");
  LinkState link;
  link.speed = ReadSpeed(root, dir + "current_link_speed");
  link.max_speed = ReadSpeed(root, dir + "max_link_speed");
  link.width = ReadWidth(root, dir + "current_link_width");
  link.max_width = ReadWidth(root, dir + "max_link_width");
  if (link.speed <= 0 || link.max_speed <= 0 || link.width <= 0 || link.max_width <= 0) {
    return std::nullopt;
  }
  return link;
}

std::string Describe(double speed, int width) {
  return absl::StrFormat("%.1f GT/s x%d", speed, width);
}

struct Tally {
  int full = 0;                        // links at what both ends support
  std::vector<std::string> idle_gpus;  // GPU links at full width, lower speed
};

// The link from chain[i] (its lower end) up to chain[i + 1]. `who` names chain[0], the GPU
// or the NIC; `pair` the GPU-NIC pair whose path this is.
void CheckLink(const Machine& machine, const SysRoot& root, const std::vector<int>& chain,
               size_t i, const std::string& who, bool gpu, const std::string& pair,
               Tally& tally, DoctorReport& report) {
  const std::string& lower = machine.pci_nodes[chain[i]].pci;
  std::optional<LinkState> link = ReadLink(root, lower);
  if (!link) return;
  double max_speed = link->max_speed;
  int max_width = link->max_width;
  std::string name = i == 0 ? absl::StrCat(who, " (", lower, ")") : absl::StrCat("bridge ", lower);
  if (i + 1 < chain.size() &&
      machine.pci_nodes[chain[i + 1]].kind != PciNode::Kind::kHostBridge) {
    const std::string& upper = machine.pci_nodes[chain[i + 1]].pci;
    if (std::optional<LinkState> partner = ReadLink(root, upper)) {
      max_speed = std::min(max_speed, partner->max_speed);
      max_width = std::min(max_width, partner->max_width);
    }
    absl::StrAppend(&name, " - bridge ", upper);
  }
  const bool slow = link->speed < max_speed, narrow = link->width < max_width;
  if (!slow && !narrow) {
    ++tally.full;
    return;
  }
  const std::string runs = Describe(link->speed, link->width);
  const std::string can = Describe(max_speed, max_width);
  if (i == 0 && gpu && !narrow) {
    tally.idle_gpus.push_back(absl::StrCat(name, " at ", runs, " of ", can));
    return;
  }
  report.findings.push_back(
      {Severity::kWarn, absl::StrCat("pcie-link ", lower),
       absl::StrCat("PCIe link ", name, " on the path ", pair, " runs at ", runs,
                    "; both ends support ", can),
       absl::StrCat("reseat the card and check its slot and riser (`lspci -vv -s ", lower,
                    "`: LnkSta against LnkCap), the slot's PCIe generation setting in the "
                    "BIOS, and whether power management slowed the link (compare under load "
                    "and with pcie_aspm=off)")});
}

}  // namespace

void CheckPcieLinks(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
                    DoctorReport& report) {
  std::set<std::string> done;  // links by their lower end
  Tally tally;
  for (const GpuDecision& d : plan.gpus) {
    if (d.nic < 0) continue;
    const Gpu& gpu = machine.gpus[d.gpu];
    const Nic& nic = machine.nics[d.nic];
    PciPath path = ClassifyPath(machine, gpu.pci_node, nic.pci_node);
    const std::set<std::string> below(path.bridges.begin(), path.bridges.end());
    const std::string pair = absl::StrCat("GPU", d.gpu, " - ", nic.name);
    for (bool at_gpu : {true, false}) {
      std::vector<int> chain;
      for (int n = at_gpu ? gpu.pci_node : nic.pci_node; n >= 0;
           n = machine.pci_nodes[n].parent) {
        chain.push_back(n);
      }
      const std::string who = at_gpu ? absl::StrCat("GPU", d.gpu) : nic.name;
      // Only links whose lower end is on the path (below the GPU and NIC's common ancestor).
      for (size_t i = 0; i < chain.size(); i += 2) {
        const std::string& lower = machine.pci_nodes[chain[i]].pci;
        if (i > 0 && !below.count(lower)) break;
        if (!done.insert(lower).second) continue;
        CheckLink(machine, root, chain, i, who, at_gpu, pair, tally, report);
      }
    }
  }
  std::vector<std::string> parts;
  if (tally.full > 0) {
    parts.push_back(absl::StrCat(tally.full, " PCIe link(s) on the GPU-NIC paths run at the "
                                             "speed and width both ends support"));
  }
  if (!tally.idle_gpus.empty()) {
    parts.push_back(absl::StrCat(
        "GPU link(s) at full width, lower speed (NVIDIA GPUs slow an idle link down; check "
        "under load with `nvidia-smi -q -d PCIE`): ",
        absl::StrJoin(tally.idle_gpus, ", ")));
  }
  // Nothing readable (a saved topology, no sysfs): say nothing.
  if (!parts.empty()) {
    report.findings.push_back({Severity::kOk, "pcie-link", absl::StrJoin(parts, "; "), ""});
  }
}

}  // namespace ferry::topology
