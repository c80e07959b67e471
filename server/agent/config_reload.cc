#include "server/agent/config_reload.h"

#include "absl/strings/str_cat.h"
#include "config/keys.h"
#include "server/agent/agent_core.h"
#include "server/agent/agent_options.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

ReloadReport ApplyReload(AgentCore& core, config::Config& running, const config::Config& next) {
  ReloadReport report;
  auto policy = core.policies().Replace(next.policy);
  if (policy.ok()) {
    std::string over;
    for (const auto& [k, v] : (*policy)->overrides) absl::StrAppend(&over, " ", k, "=", v);
    report.applied.push_back(absl::StrCat("policy: generation ", (*policy)->generation,
                                          over.empty() ? "" : "; run-time settings kept on top:",
                                          over));
    running.policy = next.policy;
    core.leases().RevokeAll("policy reloaded");  // answers kept by peers name the old one
  } else {
    report.not_applied.push_back(absl::StrCat("policy: refused, the current one stays: ",
                                              policy.status().message()));
  }
  if (next.peers != running.peers) {
    // Only the file's peers change: those found in etcd or added at run time (AddPeer) stay.
    for (const auto& change : core.peers().Update(next.peers)) {
      report.applied.push_back(absl::StrCat("peers: ", change));
    }
    running.peers = next.peers;
  }
  if (next.log_level != running.log_level) {
    spdlog::set_level(spdlog::level::from_str(next.log_level));
    report.applied.push_back(
        absl::StrCat("log.level: ", running.log_level, " -> ", next.log_level));
    running.log_level = next.log_level;
  }
  const EngineLimits current = core.engine().limits();
  EngineLimits limits = EngineLimitsFromConfig(next);
  // The per-peer window and the per-uid transfers need a restart (their keys say so in
  // config/keys.cc, and RestartOnlyChanges names them) and the history's bounds have no key:
  // they stay as the engine runs.
  limits.peer_window_bytes = current.peer_window_bytes;
  limits.per_uid_transfers = current.per_uid_transfers;
  limits.history = current.history;
  limits.history_ops = current.history_ops;
  if (limits.max_op_bytes != current.max_op_bytes ||
      limits.max_ops_per_submit != current.max_ops_per_submit ||
      limits.default_timeout != current.default_timeout ||
      limits.max_timeout != current.max_timeout || limits.slice_bytes != current.slice_bytes ||
      limits.shutdown_grace != current.shutdown_grace) {
    core.engine().SetLimits(limits);
    report.applied.push_back(
        "limits: new Submits (and a drain, for shutdown_grace_ms) use the reloaded limits");
    running.max_op_bytes = next.max_op_bytes;
    running.max_ops_per_submit = next.max_ops_per_submit;
    running.default_timeout_ms = next.default_timeout_ms;
    running.max_timeout_ms = next.max_timeout_ms;
    running.slice_bytes = next.slice_bytes;
    running.shutdown_grace_ms = next.shutdown_grace_ms;
  }
  for (const auto& key : config::RestartOnlyChanges(running, next)) {
    report.not_applied.push_back(absl::StrCat(key, ": changed in the file; needs a restart, the "
                                              "running value stays"));
  }
  return report;
}

}  // namespace ferry::server
