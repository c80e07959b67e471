// The plan names one NIC per GPU (in `ferryctl topo`, in every leg); the rails rule
// (rails.h) decides which NICs its bytes take. Two things are worth a warning:
//
// - A GPU whose chosen NIC is not among the NICs that carry its traffic: results would name
//   a NIC the bytes never crossed. The rule starts from the plan's choice, so today this
//   only happens when a plan picks a NIC that has no fabric (excluded or down): a bug, not
//   a setting.
// - A NIC chosen for several GPUs while a selectable NIC as near (or nearer) to one of them
//   is chosen for none: those GPUs split one link for no reason the topology gives. The
//   planner fills NICs in GPU order, so a GPU can take the first of two equal NICs and a
//   later GPU then has only that one near it (a chassis missing some GPUs, with a GPU's own
//   NICs in nics.deny). rails.h then stripes the first GPU over the idle NIC too, but the
//   later one still shares. An excluded or down NIC is no alternative: sharing forced by
//   nics.allow / nics.deny is what the operator asked for, and CheckNics already says so.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/policy.h"
#include "transport/topology/doctor_checks.h"
#include "transport/topology/rails.h"

namespace ferry::topology {
namespace {

using config::PathClass;
using config::PathClassName;

std::string GpuName(const Machine& machine, int gpu) {
  return absl::StrCat("GPU", gpu, " (", machine.gpus[gpu].pci, ")");
}

// The NICs that carry GPU `gpu`'s traffic: its rails that have a fabric (one per selectable
// NIC, DESIGN.md "Rails").
std::vector<int> Carriers(const Machine& machine, const TopologyPlan& plan, int gpu) {
  std::vector<int> out;
  for (int n : GpuNics(machine, plan, gpu)) {
    if (plan.nics[n].selectable) out.push_back(n);
  }
  return out;
}

std::string Names(const Machine& machine, const std::vector<int>& nics, const char* sep) {
  std::vector<std::string> names;
  for (int n : nics) names.push_back(machine.nics[n].name);
  return absl::StrJoin(names, sep);
}

// Check 1: the chosen NIC carries the GPU's traffic. False when it warned.
bool ChosenNicCarries(const Machine& machine, const TopologyPlan& plan, int gpu,
                      DoctorReport& report) {
  const int chosen = plan.gpus[gpu].nic;
  const bool known = chosen < static_cast<int>(machine.nics.size());
  std::vector<int> carriers;
  if (known) carriers = Carriers(machine, plan, gpu);  // GpuNics indexes by `chosen`
  for (int n : carriers) {
    if (n == chosen) return true;
  }
  std::string name =
      known ? machine.nics[chosen].name : absl::StrCat("NIC #", chosen, " (not on this machine)");
  if (known && !plan.nics[chosen].selectable) {
    absl::StrAppend(&name, " (", plan.nics[chosen].excluded, ")");
  }
  report.findings.push_back(
      {Severity::kWarn, absl::StrCat("rails gpu", gpu),
       absl::StrCat(GpuName(machine, gpu), " is planned on ", name, ", but its traffic ",
                    carriers.empty()
                        ? std::string("has no NIC to leave through")
                        : absl::StrCat("leaves through ", Names(machine, carriers, ", "))),
       "results name a NIC the bytes do not cross: a ferry bug (the plan and "
       "transport/topology/rails.h disagree); report it with `ferryctl topo --json`"});
  return false;
}

// Check 2: NIC `shared` serves several GPUs while a selectable NIC as near to one of them
// serves none. False when it warned.
bool ShareIsUnavoidable(const Machine& machine, const TopologyPlan& plan, int shared,
                        DoctorReport& report) {
  const std::string& name = machine.nics[shared].name;
  const std::vector<int>& gpus = plan.nics[shared].gpus;
  std::vector<int> idle;
  std::vector<std::string> idle_facts;  // "mlx5_7 (NODE to GPU4, like mlx5_6)"
  for (int n = 0; n < static_cast<int>(machine.nics.size()); ++n) {
    if (!plan.nics[n].selectable || !plan.nics[n].gpus.empty()) continue;
    for (int g : gpus) {
      const PathClass to_idle = plan.paths[g][n], to_shared = plan.paths[g][shared];
      if (to_idle > to_shared) continue;
      idle.push_back(n);
      idle_facts.push_back(
          absl::StrCat(machine.nics[n].name, " (", PathClassName(to_idle), " to GPU", g,
                       to_idle == to_shared
                           ? absl::StrCat(", like ", name)
                           : absl::StrCat(", nearer than ", name, "'s ", PathClassName(to_shared)),
                       ")"));
      break;
    }
  }
  if (idle.empty()) return true;

  // Nearer NICs the filter (or a down port) took from the sharing GPUs: giving one back
  // ends the share.
  std::vector<std::string> sharers, excluded;
  for (int g : gpus) {
    sharers.push_back(GpuName(machine, g));
    std::vector<std::string> nearer;
    for (int n = 0; n < static_cast<int>(machine.nics.size()); ++n) {
      if (plan.nics[n].selectable || plan.paths[g][n] >= plan.paths[g][shared]) continue;
      nearer.push_back(absl::StrCat(machine.nics[n].name, " (", PathClassName(plan.paths[g][n]),
                                    ", ", plan.nics[n].excluded, ")"));
    }
    if (!nearer.empty()) {
      excluded.push_back(absl::StrCat("GPU", g, " could use ", absl::StrJoin(nearer, ", ")));
    }
  }
  std::string remedy;
  if (!excluded.empty()) {
    remedy = absl::StrCat("check nics.allow / nics.deny: ", absl::StrJoin(excluded, "; "), "; ");
  }
  absl::StrAppend(&remedy, "the planner should have used ", Names(machine, idle, ", "),
                  ": report it with `ferryctl topo --json`");
  report.findings.push_back({Severity::kWarn, absl::StrCat("rails ", name),
                             absl::StrCat(name, " is shared by ", absl::StrJoin(sharers, ", "),
                                          " while ", absl::StrJoin(idle_facts, ", "),
                                          idle.size() == 1 ? " serves" : " serve", " no GPU"),
                             std::move(remedy)});
  return false;
}

}  // namespace

void CheckRails(const Machine& machine, const TopologyPlan& plan, DoctorReport& report) {
  bool clean = true;
  std::vector<std::string> rails;  // "GPU0 mlx5_0", "GPU0 mlx5_0+mlx5_1" when it stripes
  for (int g = 0; g < static_cast<int>(plan.gpus.size()); ++g) {
    if (plan.gpus[g].nic < 0) continue;  // no NIC: tcp, nothing to compare
    if (!ChosenNicCarries(machine, plan, g, report)) {
      clean = false;
      continue;
    }
    rails.push_back(absl::StrCat("GPU", g, " ", Names(machine, Carriers(machine, plan, g), "+")));
  }
  for (int n = 0; n < static_cast<int>(machine.nics.size()); ++n) {
    if (!plan.nics[n].selectable || plan.nics[n].gpus.size() < 2) continue;
    clean &= ShareIsUnavoidable(machine, plan, n, report);
  }
  // No GPU with a NIC (none, or no NIC at all): there are no rails to speak of.
  if (clean && !rails.empty()) {
    report.findings.push_back(
        {Severity::kOk, "rails",
         absl::StrCat("GPU rails, chosen NIC first: ", absl::StrJoin(rails, ", "),
                      "; no NIC is shared while one as near is idle"),
         ""});
  }
}

}  // namespace ferry::topology
