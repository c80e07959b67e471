#pragma once
// The leg plan for engines that only ever see host memory (unit tests, the engine-only bench):
// every leg is a host leg, nothing is staged.

#include "server/buffers/buffer_registry.h"
#include "server/engine/leg_planner.h"

namespace ferry::fake {

inline server::LegPlan HostOnlyPlan(const server::Buffer&, const server::PolicySnapshot&,
                                    const fabric::RailId&) {
  server::LegPlan plan;
  plan.mode = server::LegMode::kHost;
  plan.device = "host";
  plan.backend = "host";
  plan.reason = "host memory";
  return plan;
}

}  // namespace ferry::fake
