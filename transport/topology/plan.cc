#include "transport/topology/plan.h"

#include <algorithm>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/topology/discovery.h"
#include "transport/topology/path_class.h"

namespace ferry::topology {
namespace {

using config::GdrMode;
using config::PathClass;
using config::PathClassName;

bool Contains(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

absl::Status CheckNames(const Machine& machine, const std::vector<std::string>& names,
                        absl::string_view key) {
  for (const std::string& name : names) {
    if (machine.FindNic(name)) continue;
    std::vector<std::string> known;
    for (const Nic& nic : machine.nics) known.push_back(nic.name);
    return absl::InvalidArgumentError(absl::StrCat(
        key, " names unknown NIC '", name, "' (",
        known.empty() ? "this machine has no RDMA NICs"
                      : absl::StrCat("this machine has ", absl::StrJoin(known, ", ")),
        ")"));
  }
  return absl::OkStatus();
}

constexpr char kHostOnlyReason[] =
    "not a PCI device (a virtual RDMA device such as rxe or siw): carries host memory, never "
    "GPU memory, since GPUDirect RDMA needs a PCIe peer-to-peer path from the GPU to the NIC";

std::string NumaText(int numa) {
  return numa >= 0 ? absl::StrCat("NUMA node ", numa) : "an unknown NUMA node";
}

// True when `a` is the better choice than `b` among NICs of the same path class.
bool Preferred(const Machine& machine, const TopologyPlan& plan, int a, int b) {
  const Nic& x = machine.nics[a];
  const Nic& y = machine.nics[b];
  size_t load_x = plan.nics[a].gpus.size(), load_y = plan.nics[b].gpus.size();
  if (load_x != load_y) return load_x < load_y;
  // Faster link: the active port rate when known (sysfs), else the PCIe link speed.
  if (x.RateGbps() != y.RateGbps()) return x.RateGbps() > y.RateGbps();
  if (x.pci_link_gbytes != y.pci_link_gbytes) return x.pci_link_gbytes > y.pci_link_gbytes;
  return NaturalLess(x.name, y.name);
}

}  // namespace

const char* TransferModeName(TransferMode mode) {
  switch (mode) {
    case TransferMode::kGdr: return "gdr";
    case TransferMode::kStaged: return "staged";
    case TransferMode::kUnavailable: return "unavailable";
  }
  return "?";
}

absl::StatusOr<TopologyPlan> BuildPlan(const Machine& machine,
                                       const config::NicFilter& nic_filter,
                                       const config::Policy& policy) {
  absl::Status names = CheckNames(machine, nic_filter.allow, "nics.allow");
  if (!names.ok()) return names;
  names = CheckNames(machine, nic_filter.deny, "nics.deny");
  if (!names.ok()) return names;

  TopologyPlan plan;
  plan.policy = policy;
  plan.nic_filter = nic_filter;
  plan.paths = ComputePathMatrix(machine);
  plan.nics.resize(machine.nics.size());
  bool any_selectable = false;
  for (size_t n = 0; n < machine.nics.size(); ++n) {
    const Nic& nic = machine.nics[n];
    NicState& state = plan.nics[n];
    if (Contains(nic_filter.deny, nic.name)) {
      state.excluded = "excluded by nics.deny";
    } else if (!nic_filter.allow.empty() && !Contains(nic_filter.allow, nic.name)) {
      state.excluded = "not in nics.allow";
    } else if (!nic.Usable()) {
      state.excluded = "all ports down";
    }
    state.selectable = state.excluded.empty();
    if (nic.pci_node < 0) {
      state.host_only = true;
      state.host_only_reason = kHostOnlyReason;
    }
    any_selectable |= state.selectable;
  }
  plan.provider = any_selectable ? "verbs" : "tcp";

  // GPUs in index (PCI bus) order; each takes the best NIC given earlier choices, which
  // keeps the spread rule: a GPU only lands on a loaded NIC when every equal one is loaded.
  for (size_t g = 0; g < machine.gpus.size(); ++g) {
    const Gpu& gpu = machine.gpus[g];
    GpuDecision decision;
    decision.gpu = static_cast<int>(g);
    int best = -1;
    for (size_t n = 0; n < machine.nics.size(); ++n) {
      if (!plan.nics[n].selectable || plan.nics[n].host_only) continue;
      int candidate = static_cast<int>(n);
      if (best < 0 || plan.paths[g][n] < plan.paths[g][best] ||
          (plan.paths[g][n] == plan.paths[g][best] &&
           Preferred(machine, plan, candidate, best))) {
        best = candidate;
      }
    }
    // Nearer NICs that were not eligible: say so, so an allow/deny list or a down port
    // visibly takes effect in the reason.
    std::vector<std::string> skipped;
    std::vector<std::string> host_carriers;  // host-only NICs: they carry the staged bytes
    for (size_t n = 0; n < machine.nics.size(); ++n) {
      const NicState& state = plan.nics[n];
      if (state.selectable && state.host_only) host_carriers.push_back(machine.nics[n].name);
      if (state.selectable && !state.host_only) continue;
      const std::string& why = state.selectable ? state.host_only_reason : state.excluded;
      if (best >= 0 && (state.host_only || plan.paths[g][n] >= plan.paths[g][best])) continue;
      skipped.push_back(best >= 0 ? absl::StrCat(machine.nics[n].name, " (",
                                                 PathClassName(plan.paths[g][n]), ", ", why,
                                                 ")")
                                  : absl::StrCat(machine.nics[n].name, ": ", why));
    }

    std::string rule;
    switch (policy.gdr) {
      case GdrMode::kAuto:
        rule = absl::StrCat("policy allows GDR up to ", PathClassName(policy.gdr_max_path));
        break;
      case GdrMode::kAlways:
        rule = "policy gdr=always allows GDR on any path";
        break;
      case GdrMode::kNever:
        rule = "policy gdr=never";
        break;
    }

    if (best < 0) {
      decision.reason = absl::StrCat(
          "GPU ", gpu.pci, " has no usable RDMA NIC (",
          skipped.empty() ? "none found" : absl::StrJoin(skipped, "; "), ")");
      if (policy.fallback == config::Fallback::kStaged) {
        decision.mode = TransferMode::kStaged;
        decision.bounce_numa = gpu.numa;
        absl::StrAppend(&decision.reason, "; staging through host memory on ",
                        NumaText(gpu.numa), " over ",
                        host_carriers.empty() ? std::string("tcp")
                                              : absl::StrJoin(host_carriers, ", "));
      } else {
        decision.mode = TransferMode::kUnavailable;
        absl::StrAppend(&decision.reason, "; fallback=fail: no transfer path for this GPU");
      }
      plan.gpus.push_back(decision);
      continue;
    }

    const Nic& nic = machine.nics[best];
    PathClass path = plan.paths[g][best];
    decision.nic = best;
    decision.path = path;
    plan.nics[best].gpus.push_back(static_cast<int>(g));
    bool gdr = policy.gdr == GdrMode::kAlways ||
               (policy.gdr == GdrMode::kAuto && path <= policy.gdr_max_path);
    decision.reason = absl::StrCat("GPU ", gpu.pci, " and ", nic.name, " are ",
                                   PathClassName(path), " apart (",
                                   DescribePath(path, gpu.numa, nic.numa), ")");
    if (!skipped.empty()) {
      absl::StrAppend(&decision.reason, "; not using nearer ", absl::StrJoin(skipped, ", "));
    }
    absl::StrAppend(&decision.reason, "; ", rule, "; ");
    if (gdr) {
      decision.mode = TransferMode::kGdr;
      absl::StrAppend(&decision.reason, "using GDR");
    } else if (policy.fallback == config::Fallback::kStaged) {
      // The bounce pool sits next to the NIC: the wire leg then stays on the NIC's socket
      // and only the GPU copy crosses the interconnect.
      decision.mode = TransferMode::kStaged;
      decision.bounce_numa = nic.numa;
      absl::StrAppend(&decision.reason, "staging through host memory on ",
                      NumaText(nic.numa));
    } else {
      decision.mode = TransferMode::kUnavailable;
      absl::StrAppend(&decision.reason, "fallback=fail: no transfer path for this GPU");
    }
    plan.gpus.push_back(decision);
  }
  return plan;
}

}  // namespace ferry::topology
