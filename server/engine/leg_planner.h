#pragma once
// How bytes leave or reach one buffer on this agent: `host`, `gdr` (the NIC touches GPU
// memory) or `staged` (through a bounce chunk in host memory next to the NIC), or
// `unavailable` when the policy's fallback is `fail`. A pure function of the buffer, the
// topology plan under the policy snapshot, and what the fabric could register.

#include <string>

#include "server/buffers/buffer_registry.h"
#include "server/policy/leg_mode.h"
#include "server/policy/policy_store.h"
#include "transport/topology/machine.h"

namespace ferry::server {

struct LegPlan {
  LegMode mode = LegMode::kHost;
  std::string device;   // "host", "cuda:N"
  std::string backend;  // "host", "cuda", "sim"
  std::string nic;      // the NIC the topology chose for the GPU ("" for none)
  std::string path;     // GPU-NIC path class ("" for host or no NIC)
  std::string reason;
  int bounce_numa = -1; // staged: NUMA node of the bounce chunks
};

// `rail` is the fabric the transfer uses; `buffer.region(rail)` tells whether it can reach
// the buffer directly, and the buffer's registration attempt with it why not. `topology_gpu` is the
// buffer's GPU in `machine.gpus` (matched by PCI address), -1 when the topology does not have it.
LegPlan PlanLeg(const Buffer& buffer, int topology_gpu, const topology::Machine& machine,
                const PolicySnapshot& snapshot, const fabric::RailId& rail);

}  // namespace ferry::server
