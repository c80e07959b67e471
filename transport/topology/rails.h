#pragma once
// Which NICs carry a memory's traffic (DESIGN.md, "Rails"): the one rule that registration,
// routing and `ferryctl doctor` share, so the NIC a report names is the NIC the bytes take.
// Pure functions of the machine and the plan.

#include <vector>

#include "transport/topology/machine.h"
#include "transport/topology/plan.h"

namespace ferry::topology {

// The NICs (indices into Machine::nics) that carry GPU `gpu`'s traffic: the NIC the plan
// chose for it, and every other selectable NIC of the same path class to it that the plan
// did not choose for another GPU (a GPU with two PIX NICs of its own uses both; on an
// 8-GPU / 8-NIC node each GPU keeps to its one). Never a host-only NIC (plan.h). Empty when
// the GPU has no NIC.
std::vector<int> GpuNics(const Machine& machine, const TopologyPlan& plan, int gpu);

// The NICs that carry host memory on NUMA node `numa`: every selectable NIC on that node
// (host-only ones included);
// every selectable NIC when the node has none or is unknown (-1).
std::vector<int> HostNics(const Machine& machine, const TopologyPlan& plan, int numa);

}  // namespace ferry::topology
