#include "server/agent/config_reload.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/agent/agent_core.h"
#include "server/agent/agent_options.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

std::string Join(const std::vector<std::string>& v) { return absl::StrJoin(v, ","); }

std::string Nics(const config::NicFilter& n) {
  return absl::StrCat("allow=", Join(n.allow), " deny=", Join(n.deny));
}

}  // namespace

std::vector<std::string> RestartOnlyChanges(const config::Config& a, const config::Config& b) {
  // Each key as text, so one table covers every type.
  using Show = std::function<std::string(const config::Config&)>;
  const std::vector<std::pair<const char*, Show>> keys = {
      {"node", [](const auto& c) { return c.node; }},
      {"listen.local", [](const auto& c) { return c.local_socket; }},
      {"listen.local_tcp", [](const auto& c) { return c.local_tcp; }},
      {"listen.local_mode", [](const auto& c) { return absl::StrCat(c.local_socket_mode); }},
      {"listen.local_group", [](const auto& c) { return c.local_socket_group; }},
      {"listen.peer", [](const auto& c) { return c.peer_listen; }},
      {"host_pool.size", [](const auto& c) { return absl::StrCat(c.host_pool_bytes); }},
      {"host_pool.numa", [](const auto& c) { return absl::StrCat(c.host_pool_numa); }},
      {"providers", [](const auto& c) { return Join(c.providers); }},
      {"tcp.connections", [](const auto& c) { return absl::StrCat(c.tcp_connections); }},
      {"tcp.listen", [](const auto& c) { return c.tcp_listen; }},
      {"tcp.rails",
       [](const auto& c) {
         std::string rails = c.tcp_rails_auto ? "auto" : "";
         for (const auto& [nic, address] : c.tcp_rails)
           absl::StrAppend(&rails, nic, "=", address, ",");
         return rails;
       }},
      {"log.format", [](const auto& c) { return c.log_format; }},
      {"metrics.listen", [](const auto& c) { return c.metrics_listen; }},
      // Certificates are read at start; a rotated file at the same path needs a restart too.
      {"security",
       [](const auto& c) {
         const auto& s = c.security;
         return absl::StrCat(s.implicit ? "(none)" : s.mode, "/", s.ca, "/", s.cert, "/", s.key,
                             "/", s.allow_insecure_remote, "/", s.admin_group);
       }},
      {"limits.tcp_max_connections",
       [](const auto& c) { return absl::StrCat(c.tcp_max_connections); }},
      {"limits.peer_window_bytes", [](const auto& c) { return absl::StrCat(c.peer_window_bytes); }},
      {"limits.tcp_max_connections_per_peer",
       [](const auto& c) { return absl::StrCat(c.tcp_max_connections_per_peer); }},
      {"limits.tcp_handshake_timeout_ms",
       [](const auto& c) { return absl::StrCat(c.tcp_handshake_timeout_ms); }},
      {"verbs",
       [](const auto& c) {
         const auto& v = c.verbs;
         return absl::StrCat(v.device, "/", v.port, "/", v.gid_index, "/", v.timeout, "/",
                             v.retry_cnt, "/", v.rnr_retry, "/", v.send_queue_depth, "/",
                             v.signal_every, "/", v.inline_threshold, "/", v.recv_queue_depth,
                             "/", v.cq_depth, "/", v.max_message_bytes, "/", v.traffic_class,
                             "/", v.sl, "/", v.pkey_index, "/", v.qps_per_peer);
       }},
      {"topology", [](const auto& c) { return c.topology; }},
      {"discovery",
       [](const auto& c) {
         const auto& d = c.discovery;
         return absl::StrCat(Join(d.etcd), "/", d.prefix, "/", absl::FormatDuration(d.lease_ttl),
                             "/", d.advertise);
       }},
      {"nics", [](const auto& c) { return Nics(c.nics); }},
      {"gpu",
       [](const auto& c) {
         return absl::StrCat(c.gpu_backend, "/", c.gpu_sim_count, "/", c.gpu_pool_bytes, "/",
                             c.gpu_sim_copy_bytes_per_sec);
       }},
  };
  std::vector<std::string> changed;
  for (const auto& [key, show] : keys) {
    if (show(a) != show(b)) changed.push_back(key);
  }
  return changed;
}

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
  // The per-peer window needs a restart (RestartOnlyChanges names it) and the history's
  // bounds have no key: they stay as the engine runs.
  limits.peer_window_bytes = current.peer_window_bytes;
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
  for (const auto& key : RestartOnlyChanges(running, next)) {
    report.not_applied.push_back(absl::StrCat(key, ": changed in the file; needs a restart, the "
                                              "running value stays"));
  }
  return report;
}

}  // namespace ferry::server
