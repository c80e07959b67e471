#include "transport/topology/rails.h"

namespace ferry::topology {

std::vector<int> GpuNics(const Machine& machine, const TopologyPlan& plan, int gpu) {
  std::vector<int> out;
  if (gpu < 0 || gpu >= static_cast<int>(plan.gpus.size())) return out;
  const int chosen = plan.gpus[gpu].nic;
  if (chosen < 0) return out;
  out.push_back(chosen);
  const config::PathClass best = plan.paths[gpu][chosen];
  for (int n = 0; n < static_cast<int>(machine.nics.size()); ++n) {
    if (n == chosen || !plan.nics[n].selectable || plan.nics[n].host_only ||
        plan.paths[gpu][n] != best) {
      continue;
    }
    bool serves_another = false;
    for (int g : plan.nics[n].gpus) serves_another |= g != gpu;
    if (!serves_another) out.push_back(n);
  }
  return out;
}

std::vector<int> HostNics(const Machine& machine, const TopologyPlan& plan, int numa) {
  std::vector<int> local, all;
  for (int n = 0; n < static_cast<int>(machine.nics.size()); ++n) {
    if (!plan.nics[n].selectable) continue;
    all.push_back(n);
    if (numa >= 0 && machine.nics[n].numa == numa) local.push_back(n);
  }
  return local.empty() ? all : local;
}

}  // namespace ferry::topology
