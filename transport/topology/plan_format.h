#pragma once
// Renders a topology plan for people (`ferryctl topo`: an nvidia-smi-like matrix and one
// decision line per GPU) and for scripts (`ferryctl topo --json`).

#include <string>

#include "base/json_writer.h"
#include "transport/topology/machine.h"
#include "transport/topology/plan.h"

namespace ferry::topology {

std::string FormatPlanText(const Machine& machine, const TopologyPlan& plan);

// {"gpus": [...], "nics": [...], "paths": {gpu pci: {nic: class}}, plus "source",
// "provider", "policy" and "nic_filter"}; a complete JSON document, newline-terminated.
std::string FormatPlanJson(const Machine& machine, const TopologyPlan& plan);

// Writes the plan object's members into an object the caller has opened (used by
// `ferryctl doctor --json` to embed the plan).
void WritePlanMembers(const Machine& machine, const TopologyPlan& plan, JsonWriter& json);

}  // namespace ferry::topology
