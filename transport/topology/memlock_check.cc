// ibv_reg_mr pins the pages it registers and the kernel charges them to the process's
// RLIMIT_MEMLOCK (ib_umem_get: ENOMEM once pinned pages pass the limit, unless the process
// has CAP_IPC_LOCK). The defaults are small: 8 MiB since Linux 5.16 and systemd v253, 64 KiB
// before, and containers inherit them; ferryd's host pool alone is 1 GiB. So a non-root
// ferryd under default limits starts, then fails its host registrations.
#include <linux/capability.h>
#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/byte_size.h"
#include "transport/topology/doctor_checks.h"
#include "transport/topology/memlock_need.h"

namespace ferry::topology {

MemlockLimit ProbeMemlock() {
  MemlockLimit limit;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    limit.soft_bytes = static_cast<uint64_t>(rl.rlim_cur);
  }
  // The live process, not a fixture tree: this is about whoever runs the probe.
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (!absl::StartsWith(line, "CapEff:")) continue;
    uint64_t effective = std::strtoull(line.c_str() + 7, nullptr, 16);
    limit.ipc_lock = (effective >> CAP_IPC_LOCK) & 1;
  }
  return limit;
}

MemlockNeed RegisteredHostMemory(const TopologyPlan& plan, const config::Config& config) {
  std::set<int> bounce_numas;
  for (const GpuDecision& d : plan.gpus) {
    if (d.mode == TransferMode::kStaged) bounce_numas.insert(d.bounce_numa);
  }
  const uint64_t bounce_pool = plan.policy.staging_chunk_bytes * plan.policy.staging_depth *
                               config::kBounceLegs;
  MemlockNeed need;
  need.bytes = config.host_pool_bytes + bounce_numas.size() * bounce_pool;
  need.parts = absl::StrCat("host pool ", FormatByteSize(config.host_pool_bytes));
  if (!bounce_numas.empty()) {
    absl::StrAppend(&need.parts, " + ", bounce_numas.size(), " bounce pool(s) of ",
                    FormatByteSize(bounce_pool));
  }
  return need;
}

void CheckMemlock(const TopologyPlan& plan, const config::Config& config,
                  const MemlockLimit& limit, DoctorReport& report) {
  // What ferryd registers with each RDMA NIC (memlock_need.h).
  const MemlockNeed registered = RegisteredHostMemory(plan, config);
  const uint64_t need = registered.bytes;
  const std::string& needs = registered.parts;
  const std::string soft =
      limit.soft_bytes ? FormatByteSize(*limit.soft_bytes) : std::string("unlimited");
  std::string fact = absl::StrCat("RLIMIT_MEMLOCK of this process: ", soft);
  if (limit.ipc_lock) {
    report.findings.push_back(
        {Severity::kOk, "memlock",
         absl::StrCat(fact, "; CAP_IPC_LOCK held, so registrations are not limited"), ""});
  } else if (!limit.soft_bytes || *limit.soft_bytes >= need) {
    report.findings.push_back(
        {Severity::kOk, "memlock",
         absl::StrCat(fact, "; enough for the ", FormatByteSize(need),
                      " ferryd registers with a NIC (", needs, ")"),
         ""});
  } else if (plan.provider != "verbs") {
    report.findings.push_back(
        {Severity::kOk, "memlock",
         absl::StrCat(fact, "; not needed: no RDMA NIC, and the tcp provider pins nothing"),
         ""});
  } else {
    report.findings.push_back(
        {Severity::kFail, "memlock",
         absl::StrCat(fact, " without CAP_IPC_LOCK, below the ", FormatByteSize(need),
                      " ferryd registers with a NIC (", needs,
                      "): ibv_reg_mr fails with ENOMEM"),
         "raise the limit for ferryd (this is the limit of the shell doctor ran in; "
         "ferryd's is in /proc/<pid>/limits): LimitMEMLOCK=infinity in its systemd unit, "
         "`--ulimit memlock=-1` for docker, or `<user> - memlock unlimited` in "
         "/etc/security/limits.conf; or run it with CAP_IPC_LOCK"});
  }
}

}  // namespace ferry::topology
