#pragma once
// The topology plan: the NIC for each GPU and whether transfers from that GPU may use
// GPUDirect RDMA, each decision with a one-line reason an operator can act on. A pure
// function of the machine, the NIC filter and the policy, so the agent recomputes it on
// a policy reload and tests drive it from XML fixtures.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "config/policy.h"
#include "transport/topology/machine.h"

namespace ferry::topology {

enum class TransferMode { kGdr, kStaged, kUnavailable };
const char* TransferModeName(TransferMode mode);  // "gdr", "staged", "unavailable"

struct NicState {
  // False when the operator excluded it or it cannot carry traffic.
  bool selectable = true;
  // Why not selectable: "excluded by nics.deny", "not in nics.allow", "all ports down";
  // "" when selectable.
  std::string excluded;
  // A selectable NIC with no PCI path (a virtual device: Soft-RoCE rxe, siw) carries host
  // memory only and is never chosen for a GPU: GPUDirect RDMA is the NIC's DMA engine
  // reaching GPU memory peer-to-peer over PCIe, and a software device has no DMA engine and
  // no PCIe path; its driver copies with the CPU, which cannot touch GPU memory by address.
  bool host_only = false;
  // Why host_only, in words; "" otherwise.
  std::string host_only_reason;
  // GPUs (indices) this NIC was chosen for.
  std::vector<int> gpus;
};

struct GpuDecision {
  int gpu = 0;                              // index into Machine::gpus
  int nic = -1;                             // index into Machine::nics; -1 = none
  std::optional<config::PathClass> path;    // GPU-NIC path class; nullopt without a NIC
  TransferMode mode = TransferMode::kStaged;
  int bounce_numa = -1;                     // staged only: NUMA node of the bounce pool
  std::string reason;
};

struct TopologyPlan {
  config::Policy policy;
  config::NicFilter nic_filter;
  // "verbs" when some NIC is selectable (host-only ones too), else "tcp".
  std::string provider;
  // paths[gpu][nic], every pair, selectable or not.
  std::vector<std::vector<config::PathClass>> paths;
  std::vector<NicState> nics;       // parallel to Machine::nics
  std::vector<GpuDecision> gpus;    // parallel to Machine::gpus
};

// Chooses a NIC per GPU (DESIGN.md): the smallest path class first; among equals the NIC
// serving the fewest GPUs so far (so no NIC serves two while an equal one serves none);
// then the faster link; then the name. Then decides gdr / staged / unavailable from the
// policy. Fails with InvalidArgument when nics.allow or nics.deny names a NIC the machine
// does not have.
absl::StatusOr<TopologyPlan> BuildPlan(const Machine& machine,
                                       const config::NicFilter& nic_filter,
                                       const config::Policy& policy);

}  // namespace ferry::topology
