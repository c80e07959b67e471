#include "transport/topology/doctor.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/policy.h"
#include "transport/topology/acs.h"
#include "transport/topology/doctor_checks.h"
#include "transport/topology/path_class.h"

namespace ferry::topology {
namespace {

using config::PathClass;
using config::PathClassName;

Finding Make(Severity severity, std::string check, std::string fact, std::string remedy = "") {
  return Finding{severity, std::move(check), std::move(fact), std::move(remedy)};
}

// What says an NVIDIA driver is installed; nullopt when none is. The CUDA runtime cannot
// tell "no driver" from "driver too old" (cudaErrorInsufficientDriver either way).
std::optional<std::string> NvidiaDriver(const SysRoot& root) {
  if (auto version = root.ReadLine("/proc/driver/nvidia/version")) return *version;
  if (auto version = root.ReadLine("/sys/module/nvidia/version")) {
    return absl::StrCat("nvidia module ", *version);
  }
  if (root.Exists("/sys/module/nvidia")) return "nvidia module loaded";
  return std::nullopt;
}

constexpr char kNoDriver[] =
    "no NVIDIA driver installed (no /proc/driver/nvidia/version, no /sys/module/nvidia)";

void CheckInventory(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
                    DoctorReport& report) {
  if (machine.gpus.empty()) {
    // A node without GPUs is a fine host-memory node; only a loaded driver that sees no GPU
    // says something is missing.
    if (std::optional<std::string> driver = NvidiaDriver(root)) {
      report.findings.push_back(Make(
          Severity::kWarn, "gpus",
          absl::StrCat("no NVIDIA GPUs found in ", machine.source, " (PCI class 0x0300/0x0302, "
                       "vendor 0x10de), though a driver is loaded: ", *driver),
          "check that `lstopo` and `nvidia-smi -L` list the GPUs"));
    } else {
      report.findings.push_back(Make(
          Severity::kOk, "gpus",
          absl::StrCat("no NVIDIA GPUs in ", machine.source,
                       ": this node serves host memory only")));
    }
  } else {
    report.findings.push_back(Make(Severity::kOk, "gpus",
                                   absl::StrCat(machine.gpus.size(), " NVIDIA GPU(s) in ",
                                                machine.source)));
  }
  if (machine.nics.empty()) {
    report.findings.push_back(
        Make(Severity::kWarn, "nics", "no RDMA NICs found; the tcp provider will be used",
             "load the RDMA drivers (e.g. mlx5_ib) and check /sys/class/infiniband"));
  } else {
    std::vector<std::string> names;
    for (const Nic& nic : machine.nics) names.push_back(nic.name);
    report.findings.push_back(Make(
        Severity::kOk, "nics",
        absl::StrCat(machine.nics.size(), " RDMA NIC(s): ", absl::StrJoin(names, ", "),
                     "; provider ", plan.provider)));
  }
}

std::string GdrRemedy(const Machine& machine, const TopologyPlan& plan,
                      const GpuDecision& d) {
  const Gpu& gpu = machine.gpus[d.gpu];
  if (d.nic < 0) {
    return absl::StrCat("install an RDMA NIC near GPU", d.gpu, " (", gpu.pci,
                        ") or take one out of nics.deny / into nics.allow");
  }
  if (plan.policy.gdr == config::GdrMode::kNever) {
    return "set policy gdr: auto to allow GDR";
  }
  const Nic& nic = machine.nics[d.nic];
  std::string remedy = absl::StrCat(
      "for GDR put GPU", d.gpu, " and ", nic.name,
      " under the same root complex (a PCIe switch is best; ", nic.name, " sits on ",
      nic.numa >= 0 ? absl::StrCat("NUMA node ", nic.numa) : "an unknown NUMA node",
      "), or set policy gdr_max_path: ", PathClassName(*d.path),
      " if this platform routes such peer-to-peer traffic well");
  if (d.mode == TransferMode::kUnavailable) {
    absl::StrAppend(&remedy, "; or set policy fallback: staged");
  }
  return remedy;
}

void CheckGpus(const Machine& machine, const TopologyPlan& plan, DoctorReport& report) {
  for (const GpuDecision& d : plan.gpus) {
    std::string check = absl::StrCat("gpu", d.gpu);
    switch (d.mode) {
      case TransferMode::kGdr:
        report.findings.push_back(Make(Severity::kOk, check, d.reason));
        break;
      case TransferMode::kStaged:
        report.findings.push_back(
            Make(Severity::kWarn, check, d.reason, GdrRemedy(machine, plan, d)));
        break;
      case TransferMode::kUnavailable:
        report.findings.push_back(
            Make(Severity::kFail, check, d.reason, GdrRemedy(machine, plan, d)));
        break;
    }
  }
}

void CheckNics(const Machine& machine, const TopologyPlan& plan, DoctorReport& report) {
  for (size_t n = 0; n < machine.nics.size(); ++n) {
    const Nic& nic = machine.nics[n];
    const NicState& state = plan.nics[n];
    std::string check = absl::StrCat("nic ", nic.name);
    if (!nic.Usable()) {
      std::vector<std::string> ports;
      for (const NicPort& port : nic.ports) {
        ports.push_back(absl::StrCat("port ", port.number, " ", port.state));
      }
      report.findings.push_back(Make(
          Severity::kWarn, check,
          absl::StrCat(nic.name, ": all ports down (", absl::StrJoin(ports, ", "),
                       "); not chosen for any GPU"),
          absl::StrCat("check the cable and the switch port (`ibstat ", nic.name,
                       "`), or deny it in nics.deny")));
      continue;
    }
    if (!state.selectable) {
      report.findings.push_back(
          Make(Severity::kOk, check, absl::StrCat(nic.name, ": ", state.excluded)));
      continue;
    }
    if (state.host_only) {
      report.findings.push_back(
          Make(Severity::kOk, check, absl::StrCat(nic.name, ": ", state.host_only_reason)));
      continue;
    }
    if (state.gpus.size() > 1) {
      std::vector<std::string> gpus;
      for (int g : state.gpus) gpus.push_back(absl::StrCat("GPU", g));
      report.findings.push_back(Make(
          Severity::kWarn, check,
          absl::StrCat(nic.name, " serves ", absl::StrJoin(gpus, ", "),
                       ": they share its bandwidth"),
          "add a NIC near these GPUs or accept the shared bandwidth"));
    }
    if (!machine.gpus.empty()) {
      PathClass nearest = PathClass::kSys;
      for (size_t g = 0; g < machine.gpus.size(); ++g) {
        nearest = std::min(nearest, plan.paths[g][n]);
      }
      if (nearest > PathClass::kPhb) {
        report.findings.push_back(Make(
            Severity::kWarn, check,
            absl::StrCat(nic.name, " has no GPU under its root complex (nearest is ",
                         PathClassName(nearest), ")"),
            "GPU transfers through it are staged; it still serves host memory"));
      } else if (state.gpus.size() <= 1) {
        report.findings.push_back(Make(
            Severity::kOk, check,
            absl::StrCat(nic.name, ": nearest GPU is ", PathClassName(nearest),
                         state.gpus.empty() ? "; serves no GPU"
                                            : absl::StrCat("; serves GPU", state.gpus[0]))));
      }
    }
  }
}

std::string PeerMemory(const SysRoot& root) {
  for (const char* path : {"/sys/kernel/mm/memory_peers/nv_mem/version",
                           "/sys/kernel/mm/memory_peers/nv_mem_nc/version"}) {
    if (auto version = root.ReadLine(path)) {
      return absl::StrCat("NVIDIA peer memory client registered (", path, ": ", *version, ")");
    }
  }
  if (root.Exists("/sys/module/nvidia_peermem")) {
    return absl::StrCat("nvidia_peermem module loaded (version ",
                        root.ReadLine("/sys/module/nvidia_peermem/version").value_or("?"), ")");
  }
  return "";
}

bool Supported(const SupportProbe& p) { return p.state == SupportProbe::State::kSupported; }
bool Refused(const SupportProbe& p) { return p.state == SupportProbe::State::kUnsupported; }

Finding ProbeFinding(std::string check, const SupportProbe& p, std::string remedy) {
  return Make(Supported(p) ? Severity::kOk : Severity::kWarn, std::move(check),
              p.state == SupportProbe::State::kUnknown ? absl::StrCat("unknown: ", p.detail)
                                                       : p.detail,
              Supported(p) ? "" : std::move(remedy));
}

// Peer memory and DMA-BUF: the two kernel mechanisms that let a NIC register GPU memory.
// A GPU's GDR works when there is peer memory, or when both the GPU and the NIC chosen for
// it do DMA-BUF; each chosen NIC is probed, since providers differ.
void CheckGdrSupport(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
                     const DoctorProbes& probes, DoctorReport& report) {
  if (machine.gpus.empty()) {
    report.findings.push_back(Make(
        Severity::kOk, "gdr-support",
        "no GPU on this node: peer memory and DMA-BUF for GPU memory are not needed"));
    return;
  }
  const std::optional<std::string> driver = NvidiaDriver(root);
  const std::string peer = PeerMemory(root);
  if (!peer.empty()) {
    report.findings.push_back(Make(Severity::kOk, "peer-memory", peer));
  } else {
    report.findings.push_back(Make(
        Severity::kWarn, "peer-memory",
        "no peer memory client: /sys/kernel/mm/memory_peers/nv_mem{,_nc}/version and "
        "/sys/module/nvidia_peermem are absent",
        absl::StrCat(driver ? "" : "install the NVIDIA driver, then ",
                     "modprobe nvidia_peermem (shipped with the NVIDIA driver), or rely on "
                     "DMA-BUF (Linux >= 5.12 and NVIDIA open kernel modules)")));
  }

  SupportProbe gpu = probes.gpu_dmabuf();
  if (gpu.state == SupportProbe::State::kUnknown && !driver) {
    report.findings.push_back(Make(Severity::kWarn, "dmabuf-gpu", kNoDriver,
                                   "install the NVIDIA driver (open kernel modules r515+ and "
                                   "CUDA 11.7+ for DMA-BUF export)"));
  } else {
    report.findings.push_back(ProbeFinding(
        "dmabuf-gpu", gpu,
        "DMA-BUF export needs the NVIDIA open kernel modules (r515+) and CUDA 11.7+"));
  }
  std::map<int, SupportProbe> nics;  // by NIC index, the NICs the plan chose
  for (const GpuDecision& d : plan.gpus) {
    if (d.nic < 0 || nics.count(d.nic)) continue;
    const std::string& name = machine.nics[d.nic].name;
    nics[d.nic] = probes.nic_dmabuf(name);
    report.findings.push_back(ProbeFinding(
        absl::StrCat("dmabuf-nic ", name), nics[d.nic],
        "DMA-BUF registration needs Linux >= 5.12 and rdma-core >= 34 with a provider that "
        "implements it (mlx5)"));
  }

  std::vector<std::string> refused, unverified;  // GPUs that plan GDR
  bool via_dmabuf = false;
  for (const GpuDecision& d : plan.gpus) {
    if (d.nic < 0 || !peer.empty()) continue;
    const SupportProbe& nic = nics[d.nic];
    const bool gdr = d.mode == TransferMode::kGdr;
    if (Supported(gpu) && Supported(nic)) {
      via_dmabuf = true;
    } else if (gdr) {
      (Refused(gpu) || Refused(nic) ? refused : unverified).push_back(absl::StrCat("GPU", d.gpu));
    }
  }
  if (!refused.empty()) {
    report.findings.push_back(Make(
        Severity::kFail, "gdr-support",
        absl::StrCat(absl::StrJoin(refused, ", "),
                     " plan GDR, but there is no peer memory client and DMA-BUF is not "
                     "supported: registering GPU memory will fail"),
        "modprobe nvidia_peermem, or set policy gdr: never to stage through host memory"));
  } else if (!unverified.empty()) {
    report.findings.push_back(Make(
        Severity::kWarn, "gdr-support",
        absl::StrCat(absl::StrJoin(unverified, ", "),
                     " plan GDR, but neither peer memory nor DMA-BUF could be verified"),
        "modprobe nvidia_peermem, or check DMA-BUF support on a machine with the drivers"));
  } else if (!peer.empty() || via_dmabuf) {
    report.findings.push_back(Make(
        Severity::kOk, "gdr-support",
        absl::StrCat("GPU memory can be registered with the NIC via ",
                     !peer.empty() ? "peer memory" : "DMA-BUF")));
  } else {
    report.findings.push_back(Make(
        Severity::kWarn, "gdr-support",
        "no verified way to register GPU memory with a NIC; no GPU plans GDR anyway",
        "load nvidia_peermem to make GDR possible"));
  }
}

void CheckAcs(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
              DoctorReport& report) {
  std::set<std::string> done;
  std::vector<std::string> clean, unreadable;
  for (const GpuDecision& d : plan.gpus) {
    if (d.nic < 0) continue;
    const Gpu& gpu = machine.gpus[d.gpu];
    const Nic& nic = machine.nics[d.nic];
    PciPath path = ClassifyPath(machine, gpu.pci_node, nic.pci_node);
    for (const std::string& bridge : path.bridges) {
      if (!done.insert(bridge).second) continue;
      std::string file = absl::StrCat("/sys/bus/pci/devices/", bridge, "/config");
      std::optional<std::string> config = root.Read(file);
      if (!config) {
        unreadable.push_back(absl::StrCat(bridge, " (no ", file, ")"));
        continue;
      }
      AcsReading acs = ParseAcs(*config);
      if (acs.kind == AcsReading::Kind::kUnreadable) {
        unreadable.push_back(absl::StrCat(bridge, " (only ", acs.bytes, " bytes readable)"));
      } else if (acs.Redirects()) {
        char control[8];
        std::snprintf(control, sizeof(control), "0x%04x", acs.control);
        report.findings.push_back(Make(
            Severity::kWarn, absl::StrCat("acs ", bridge),
            absl::StrCat("bridge ", bridge, " on the path GPU", d.gpu, " (", gpu.pci, ") - ",
                         nic.name, " has ACS ", acs.EnabledNames(), " enabled (ACS control ",
                         control, "): peer-to-peer traffic is sent up to the root complex"),
            absl::StrCat("disable ACS redirect on ", bridge,
                         " (BIOS setting, or `setpci -s ", bridge,
                         " ECAP_ACS+0x6.w=0000` after boot)")));
      } else {
        clean.push_back(bridge);
      }
    }
  }
  if (!clean.empty()) {
    report.findings.push_back(Make(
        Severity::kOk, "acs",
        absl::StrCat("no ACS redirect on GPU-NIC path bridges ", absl::StrJoin(clean, ", "))));
  }
  if (!unreadable.empty()) {
    report.findings.push_back(Make(
        Severity::kWarn, "acs",
        absl::StrCat("unknown: ACS of bridges ", absl::StrJoin(unreadable, ", "),
                     " could not be read"),
        "run doctor as root on the machine itself (the extended config space needs "
        "privileges)"));
  }
}

}  // namespace

const char* SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kOk: return "OK";
    case Severity::kWarn: return "WARN";
    case Severity::kFail: return "FAIL";
  }
  return "?";
}

bool DoctorReport::HasFailure() const { return Count(Severity::kFail) > 0; }

int DoctorReport::Count(Severity severity) const {
  return static_cast<int>(std::count_if(findings.begin(), findings.end(),
                                        [&](const Finding& f) { return f.severity == severity; }));
}

DoctorReport RunDoctor(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
                       const DoctorProbes& probes, const config::Config& config) {
  DoctorReport report;
  CheckInventory(machine, plan, root, report);
  CheckGpus(machine, plan, report);
  CheckNics(machine, plan, report);
  CheckRails(machine, plan, report);
  CheckGdrSupport(machine, plan, root, probes, report);
  CheckBar1(machine, root, config.gpu_pool_bytes, report);
  CheckAcs(machine, plan, root, report);
  CheckPcieLinks(machine, plan, root, report);
  CheckIommu(machine, plan, root, report);
  CheckMemlock(plan, config, probes.memlock(), report);
  return report;
}

}  // namespace ferry::topology
