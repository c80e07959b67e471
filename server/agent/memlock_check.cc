#include "server/agent/memlock_check.h"

#include "absl/strings/str_cat.h"
#include "base/byte_size.h"

namespace ferry::server {

std::string MemlockWarning(const topology::MemlockLimit& limit, const topology::MemlockNeed& need,
                           bool verbs_in_use) {
  if (!verbs_in_use || limit.ipc_lock || !limit.soft_bytes || *limit.soft_bytes >= need.bytes) {
    return "";
  }
  return absl::StrCat(
      "RLIMIT_MEMLOCK is ", FormatByteSize(*limit.soft_bytes), " (no CAP_IPC_LOCK), below the ",
      FormatByteSize(need.bytes), " this agent registers with its RDMA NICs (", need.parts,
      "): verbs registrations past the limit fail with ENOMEM. Raise it: "
      "LimitMEMLOCK=infinity in the systemd unit (deploy/systemd/ferryd.service has it), "
      "`ulimit -l unlimited` in the shell that starts ferryd, `--ulimit memlock=-1` for "
      "docker, or the IPC_LOCK capability in Kubernetes (securityContext.capabilities.add, "
      "as deploy/kubernetes/ferryd-daemonset.yaml does)");
}

}  // namespace ferry::server
