// Whether the IOMMU translates GPUDirect RDMA traffic is a property of each device's IOMMU
// group (its default domain), not of the machine: `iommu=pt` only sets the default, a group
// can be switched at run time (/sys/kernel/iommu_groups/N/type), and unrelated devices (a
// VFIO-assigned one, a USB controller) may sit in translating groups without touching the
// GPU-NIC traffic. So each GPU and each chosen NIC is judged by its own group's `type`:
// "identity" passes DMA through; "DMA" / "DMA-FQ" translate it (peer-to-peer then goes up
// to the root complex and fails or crawls); "unmanaged" (a VFIO user owns the device) and
// "blocked" mean the host's drivers cannot use it. A device with no iommu_group link is not
// behind an IOMMU at all.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "transport/topology/doctor_checks.h"

namespace ferry::topology {
namespace {

struct DeviceDomain {
  std::string type;   // the group's type, or "no iommu group" / "no type file"
  std::string group;  // "" without a group
  bool passes_through = false;
};

DeviceDomain DomainOf(const SysRoot& root, const std::string& pci, bool pt_arg) {
  std::optional<std::string> link =
      root.LinkTarget(absl::StrCat("/sys/bus/pci/devices/", pci, "/iommu_group"));
  if (!link) return {"no iommu group", "", true};
  std::string group = link->substr(link->find_last_of('/') + 1);
  std::optional<std::string> type =
      root.ReadLine(absl::StrCat("/sys/kernel/iommu_groups/", group, "/type"));
  // Kernels before 5.11 have no `type` file: the default domain then follows iommu=pt.
  if (!type) return {"no type file", group, pt_arg};
  return {*type, group, *type == "identity"};
}

}  // namespace

void CheckIommu(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
                DoctorReport& report) {
  std::vector<std::string> iommus = root.List("/sys/class/iommu");
  std::string cmdline = root.ReadLine("/proc/cmdline").value_or("");
  std::vector<std::string> iommu_args;
  for (absl::string_view token : absl::StrSplit(cmdline, ' ', absl::SkipEmpty())) {
    if (absl::StartsWith(token, "iommu") || absl::StartsWith(token, "intel_iommu") ||
        absl::StartsWith(token, "amd_iommu")) {
      iommu_args.emplace_back(token);
    }
  }
  std::string args = iommu_args.empty() ? "no iommu options" : absl::StrJoin(iommu_args, " ");
  if (iommus.empty()) {
    report.findings.push_back(
        {Severity::kOk, "iommu",
         absl::StrCat("no IOMMU active (/sys/class/iommu is empty; kernel command line: ",
                      args, ")"),
         ""});
    return;
  }
  auto has = [&](absl::string_view arg) {
    return std::find(iommu_args.begin(), iommu_args.end(), arg) != iommu_args.end();
  };
  const bool pt_arg = has("iommu=pt") || has("iommu.passthrough=1");

  // The devices GPUDirect RDMA traffic flows between: each GPU with a NIC, and that NIC.
  std::vector<std::pair<std::string, std::string>> devices;  // (label, pci), GPUs first
  std::set<int> nics;
  for (const GpuDecision& d : plan.gpus) {
    if (d.nic < 0) continue;
    devices.emplace_back(absl::StrCat("GPU", d.gpu), machine.gpus[d.gpu].pci);
    nics.insert(d.nic);
  }
  for (int n : nics) devices.emplace_back(machine.nics[n].name, machine.nics[n].pci);
  std::string seen =
      absl::StrCat("IOMMU ", absl::StrJoin(iommus, ", "), "; kernel command line: ", args);
  if (devices.empty()) {
    report.findings.push_back(
        {Severity::kOk, "iommu", absl::StrCat(seen, "; no GPU-NIC pair to check"), ""});
    return;
  }
  std::map<std::string, std::vector<std::string>> by_type;  // "identity" -> "GPU0 (group 7)"
  std::vector<std::string> translated;
  for (const auto& [label, pci] : devices) {
    DeviceDomain domain = DomainOf(root, pci, pt_arg);
    by_type[domain.type].push_back(
        domain.group.empty() ? label : absl::StrCat(label, " (group ", domain.group, ")"));
    if (!domain.passes_through) translated.push_back(label);
  }
  std::vector<std::string> groups;
  for (const auto& [type, labels] : by_type) {
    groups.push_back(absl::StrCat(type, ": ", absl::StrJoin(labels, ", ")));
  }
  absl::StrAppend(&seen, "; ", absl::StrJoin(groups, "; "));
  if (translated.empty()) {
    report.findings.push_back(
        {Severity::kOk, "iommu", absl::StrCat(seen, ": GPU and NIC DMA passes through"), ""});
    return;
  }
  report.findings.push_back(
      {Severity::kWarn, "iommu",
       absl::StrCat(seen, ": the IOMMU translates the DMA of ", absl::StrJoin(translated, ", ")),
       "boot with iommu=pt (keeps the IOMMU for VMs, passes device DMA through) or disable it "
       "(intel_iommu=off / amd_iommu=off), or set the group to identity (unbind the device, "
       "echo identity > /sys/kernel/iommu_groups/N/type, rebind); GPUDirect RDMA through a "
       "translating IOMMU fails or is slow, and a device in an unmanaged group belongs to "
       "VFIO (a VM), not to this host"});
}

}  // namespace ferry::topology
