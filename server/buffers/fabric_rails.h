#pragma once
// Which of the agent's fabrics may carry a memory's bytes: transport/topology/rails.h's rule
// (a GPU's own NIC(s); host memory: the NICs of its NUMA node) applied to the fabrics that
// run. A fabric not bound to a NIC the topology knows (the one tcp fabric without rails)
// carries everything. Memory is registered with exactly these, so the plan's NIC is the
// only one a transfer can take.

#include <string>
#include <vector>

#include "server/buffers/buffer_memory.h"
#include "transport/fabric.h"
#include "transport/topology/machine.h"
#include "transport/topology/plan.h"

namespace ferry::server {

class FabricRails {
 public:
  // `topology_gpu[g]` is our GPU g's index in machine.gpus (-1: not there); `host_numa` the
  // host pool's NUMA node (-1: not bound).
  FabricRails(std::vector<fabric::Fabric*> fabrics, const topology::Machine& machine,
              const topology::TopologyPlan& plan, std::vector<int> topology_gpu, int host_numa);

  // For host buffers (bounce chunks use every fabric: any NIC may stage).
  const std::vector<fabric::Fabric*>& ForHost() const { return host_; }
  // For our GPU `gpu`'s memory.
  std::vector<fabric::Fabric*> ForGpu(int gpu) const;
  std::vector<fabric::Fabric*> For(const BufferMemory& memory) const {
    return memory.gpu() < 0 ? host_ : ForGpu(memory.gpu());
  }

  // For GetInfo: the NUMA node of the NIC `fabric` runs on (-1 unknown), the GPUs (ours)
  // whose memory it carries, whether host buffers use it.
  int NumaOf(const fabric::Fabric& fabric) const;
  std::vector<int> GpusOf(const fabric::Fabric& fabric) const;
  bool CarriesHost(const fabric::Fabric& fabric) const;

 private:
  // The fabrics on the NICs `nics` (indices into machine_.nics), plus the unbound ones;
  // every fabric when none of them runs on those NICs.
  std::vector<fabric::Fabric*> OnNics(const std::vector<int>& nics) const;

  const std::vector<fabric::Fabric*> fabrics_;
  const topology::Machine machine_;
  std::vector<std::vector<fabric::Fabric*>> gpus_;  // by our GPU index
  std::vector<fabric::Fabric*> host_;
};

}  // namespace ferry::server
