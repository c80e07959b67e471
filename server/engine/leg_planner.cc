#include "server/engine/leg_planner.h"

#include "absl/strings/str_cat.h"

namespace ferry::server {

LegPlan PlanLeg(const Buffer& buffer, int topology_gpu, const topology::Machine& machine,
                const PolicySnapshot& snapshot, const fabric::RailId& rail) {
  LegPlan leg;
  leg.device = buffer.device();
  leg.backend = buffer.backend();
  const int gpu = buffer.gpu();
  if (gpu < 0) {
    leg.mode = LegMode::kHost;
    leg.reason = "host memory";
    return leg;
  }
  const bool fail = snapshot.policy.fallback == config::Fallback::kFail;
  if (topology_gpu < 0 || static_cast<size_t>(topology_gpu) >= snapshot.plan.gpus.size()) {
    // No PCIe position (a simulated GPU beyond the topology's): no NIC can claim it.
    leg.mode = fail ? LegMode::kUnavailable : LegMode::kStaged;
    leg.reason = absl::StrCat("GPU cuda:", gpu, " is not in the topology, so no NIC is near it; ",
                              fail ? "policy fallback is fail" : "staging through host memory");
    return leg;
  }
  const topology::GpuDecision& d = snapshot.plan.gpus[topology_gpu];
  if (d.nic >= 0) {
    leg.nic = machine.nics[d.nic].name;
    leg.bounce_numa = machine.nics[d.nic].numa;
  } else {
    leg.bounce_numa = machine.gpus[topology_gpu].numa;
  }
  if (d.path) leg.path = config::PathClassName(*d.path);
  switch (d.mode) {
    case topology::TransferMode::kUnavailable:
      leg.mode = LegMode::kUnavailable;
      leg.reason = d.reason;
      return leg;
    case topology::TransferMode::kStaged:
      leg.mode = LegMode::kStaged;
      leg.reason = d.reason;
      if (d.bounce_numa >= 0) leg.bounce_numa = d.bounce_numa;
      return leg;
    case topology::TransferMode::kGdr:
      break;
  }
  if (buffer.region(rail) != nullptr) {
    leg.mode = LegMode::kGdr;
    leg.reason = d.reason;
    return leg;
  }
  // The topology allows GDR but the fabric cannot reach this memory: the registration
  // failed (or the provider, like tcp, cannot touch real GPU memory at all).
  leg.mode = fail ? LegMode::kUnavailable : LegMode::kStaged;
  // Why: the buffer's failed registration attempt with this rail.
  std::string why = absl::StrCat("provider ", rail.ToString(), " cannot register GPU memory");
  for (const RegistrationAttempt& attempt : buffer.attempts()) {
    if (attempt.rail == rail && !attempt.status.ok()) why = std::string(attempt.status.message());
  }
  leg.reason = absl::StrCat(
      d.reason, "; but ", why,
      fail ? "; policy fallback is fail"
           : absl::StrCat("; staging through host memory on NUMA node ", leg.bounce_numa));
  return leg;
}

}  // namespace ferry::server
