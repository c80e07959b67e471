#pragma once
// `ferryctl doctor`: a checklist of what decides whether GPUDirect RDMA can work on this
// node, each finding with the fact seen and a remedy. Every sysfs/procfs read goes through
// a SysRoot so tests run the checks against fixture trees; driver probes are injectable.

#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "transport/topology/machine.h"
#include "transport/topology/plan.h"
#include "transport/topology/probes.h"
#include "transport/topology/sys_root.h"

namespace ferry::topology {

enum class Severity { kOk, kWarn, kFail };
const char* SeverityName(Severity severity);  // "OK", "WARN", "FAIL"

struct Finding {
  Severity severity = Severity::kOk;
  // Stable id: "gpu0", "peer-memory", "acs", "iommu", "nic mlx5_0", "dmabuf-nic mlx5_0",
  // "memlock", "bar1 gpu0", "pcie-link 0000:18:00.0", "rails", "rails gpu0",
  // "rails mlx5_0", ...
  std::string check;
  std::string fact;    // what was seen
  std::string remedy;  // what to do; "" when nothing is needed
};

struct DoctorReport {
  std::vector<Finding> findings;
  bool HasFailure() const;
  int Count(Severity severity) const;
};

struct DoctorProbes {
  // Called once per NIC the plan chose for a GPU, with its name.
  std::function<SupportProbe(const std::string& nic)> nic_dmabuf = ProbeNicDmabuf;
  std::function<SupportProbe()> gpu_dmabuf = ProbeGpuDmabuf;
  std::function<MemlockLimit()> memlock = ProbeMemlock;
};

// `config` says what ferryd would pin and map (host pool, GPU pool sizes); `plan` must
// have been built from its nics and policy.
DoctorReport RunDoctor(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
                       const DoctorProbes& probes = DoctorProbes(),
                       const config::Config& config = config::Config());

std::string FormatDoctorText(const DoctorReport& report);
// {"ok": bool, "counts": {"ok","warn","fail"}, "findings": [{severity, check, fact,
// remedy}], "topology": {the `ferryctl topo --json` object}}.
std::string FormatDoctorJson(const DoctorReport& report, const Machine& machine,
                             const TopologyPlan& plan);

}  // namespace ferry::topology
