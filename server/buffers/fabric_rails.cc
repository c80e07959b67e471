#include "server/buffers/fabric_rails.h"

#include <algorithm>

#include "transport/topology/rails.h"

namespace ferry::server {

FabricRails::FabricRails(std::vector<fabric::Fabric*> fabrics, const topology::Machine& machine,
                         const topology::TopologyPlan& plan, std::vector<int> topology_gpu,
                         int host_numa)
    : fabrics_(std::move(fabrics)), machine_(machine) {
  const bool planned = plan.nics.size() == machine.nics.size();
  host_ = planned ? OnNics(topology::HostNics(machine, plan, host_numa)) : fabrics_;
  for (int t : topology_gpu) {
    gpus_.push_back(planned && t >= 0 ? OnNics(topology::GpuNics(machine, plan, t))
                                      : OnNics(topology::HostNics(machine, plan, -1)));
  }
}

std::vector<fabric::Fabric*> FabricRails::OnNics(const std::vector<int>& nics) const {
  std::vector<fabric::Fabric*> out;
  bool any_bound = false;
  for (fabric::Fabric* f : fabrics_) {
    std::optional<int> nic = machine_.FindNic(f->rail().nic);
    if (!nic) {
      out.push_back(f);  // not on a NIC the topology knows: it carries everything
      continue;
    }
    if (std::find(nics.begin(), nics.end(), *nic) != nics.end()) {
      out.push_back(f);
      any_bound = true;
    }
  }
  // Rails on NICs the rule does not pick and nothing else: keep the memory reachable.
  if (!any_bound && out.empty()) return fabrics_;
  return out;
}

std::vector<fabric::Fabric*> FabricRails::ForGpu(int gpu) const {
  if (gpu < 0 || gpu >= static_cast<int>(gpus_.size())) return fabrics_;
  return gpus_[gpu];
}

int FabricRails::NumaOf(const fabric::Fabric& fabric) const {
  std::optional<int> nic = machine_.FindNic(fabric.rail().nic);
  return nic ? machine_.nics[*nic].numa : -1;
}

std::vector<int> FabricRails::GpusOf(const fabric::Fabric& fabric) const {
  std::vector<int> out;
  for (size_t g = 0; g < gpus_.size(); ++g) {
    if (std::find(gpus_[g].begin(), gpus_[g].end(), &fabric) != gpus_[g].end())
      out.push_back(static_cast<int>(g));
  }
  return out;
}

bool FabricRails::CarriesHost(const fabric::Fabric& fabric) const {
  return std::find(host_.begin(), host_.end(), &fabric) != host_.end();
}

}  // namespace ferry::server
