#include "config/config.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/byte_size.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "base/text_file.h"
#include "yaml-cpp/yaml.h"

namespace ferry::config {
namespace {

// Where a YAML node sits, for messages: "ferry.yaml:12: key 'tcp.connections': ...".
class Context {
 public:
  explicit Context(absl::string_view origin) : origin_(origin) {}

  absl::Status Error(const YAML::Node& node, absl::string_view key, absl::string_view what) const {
    int line = node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, ":", line, ": key '", key, "': ", what));
  }

 private:
  std::string origin_;
};

absl::Status CheckKeys(const Context& ctx, const YAML::Node& map, absl::string_view section,
                       const std::set<std::string>& known) {
  if (!map.IsMap()) {
    return ctx.Error(map, section.empty() ? "<top>" : section, "expected a mapping");
  }
  std::set<std::string> seen;
  for (const auto& item : map) {
    std::string key = item.first.as<std::string>();
    std::string full_key = section.empty() ? key : absl::StrCat(section, ".", key);
    // YAML parsers keep one of two equal keys silently; a config must not mean two things.
    if (!seen.insert(key).second) return ctx.Error(item.first, full_key, "appears twice");
    if (!known.count(key)) {
      std::string full = section.empty() ? key : absl::StrCat(section, ".", key);
      return ctx.Error(item.first, full,
                       absl::StrCat("unknown key (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadString(const Context& ctx, const YAML::Node& node,
                                       absl::string_view key) {
  if (!node.IsScalar()) return ctx.Error(node, key, "expected a string");
  return node.as<std::string>();
}

absl::StatusOr<uint64_t> ReadByteSize(const Context& ctx, const YAML::Node& node,
                                      absl::string_view key) {
  if (!node.IsScalar()) return ctx.Error(node, key, "expected a size such as 1GiB");
  auto size = ParseByteSize(node.as<std::string>());
  if (!size.ok()) return ctx.Error(node, key, size.status().message());
  return *size;
}

absl::StatusOr<uint32_t> ReadCount(const Context& ctx, const YAML::Node& node,
                                   absl::string_view key, uint32_t min, uint32_t max) {
  uint32_t value = 0;
  if (!node.IsScalar() || !absl::SimpleAtoi(node.as<std::string>(), &value)) {
    return ctx.Error(node, key, "expected a whole number");
  }
  if (value < min || value > max) {
    return ctx.Error(node, key, absl::StrCat(value, " is outside ", min, "..", max));
  }
  return value;
}

absl::StatusOr<std::vector<std::string>> ReadStringList(const Context& ctx,
                                                        const YAML::Node& node,
                                                        absl::string_view key) {
  if (!node.IsSequence()) return ctx.Error(node, key, "expected a list of names");
  std::vector<std::string> out;
  for (const auto& item : node) {
    ASSIGN_OR_RETURN(std::string s, ReadString(ctx, item, key));
    out.push_back(std::move(s));
  }
  return out;
}

// "host:port" with a numeric port.
absl::Status CheckAddress(const Context& ctx, const YAML::Node& node, absl::string_view key,
                          const std::string& address) {
  absl::Status valid = ValidateAddress(address);
  return valid.ok() ? valid : ctx.Error(node, key, valid.message());
}

// A duration such as 10s or 1500ms, within [min, max].
absl::StatusOr<absl::Duration> ReadDuration(const Context& ctx, const YAML::Node& node,
                                            absl::string_view key, absl::Duration min,
                                            absl::Duration max) {
  absl::Duration d;
  if (!node.IsScalar() || !absl::ParseDuration(node.as<std::string>(), &d)) {
    return ctx.Error(node, key, "expected a duration such as 10s or 500ms");
  }
  if (d < min || d > max) {
    return ctx.Error(node, key,
                     absl::StrCat(absl::FormatDuration(d), " is outside ",
                                  absl::FormatDuration(min), "..", absl::FormatDuration(max)));
  }
  return d;
}

absl::Status ParseDiscoverySection(const Context& ctx, const YAML::Node& node,
                                   DiscoverySettings& d) {
  RETURN_IF_ERROR(CheckKeys(ctx, node, "discovery", {"etcd", "prefix", "lease_ttl", "advertise"}));
  auto etcd = node["etcd"];
  if (!etcd) return ctx.Error(node, "discovery.etcd", "missing: list etcd's client endpoints");
  if (etcd.IsScalar()) {
    return ctx.Error(etcd, "discovery.etcd", "expected a list of host:port, e.g. [127.0.0.1:2379]");
  }
  ASSIGN_OR_RETURN(d.etcd, ReadStringList(ctx, etcd, "discovery.etcd"));
  if (d.etcd.empty()) return ctx.Error(etcd, "discovery.etcd", "must list at least one endpoint");
  for (std::string& endpoint : d.etcd) {
    if (absl::StartsWith(endpoint, "https://")) {
      return ctx.Error(etcd, "discovery.etcd",
                       absl::StrCat("'", endpoint, "': TLS to etcd is not supported yet"));
    }
    if (absl::StartsWith(endpoint, "http://")) endpoint = endpoint.substr(7);
    if (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    absl::Status valid = ValidateAddress(endpoint, /*allow_port_0=*/false);
    if (!valid.ok()) return ctx.Error(etcd, "discovery.etcd", valid.message());
  }
  if (auto n = node["prefix"]) {
    ASSIGN_OR_RETURN(d.prefix, ReadString(ctx, n, "discovery.prefix"));
    // A prefix without its trailing '/' would also watch "/ferry/nodes2/...".
    if (d.prefix.empty() || d.prefix.back() != '/') {
      return ctx.Error(n, "discovery.prefix",
                       absl::StrCat("'", d.prefix, "' must end with '/' (keys are prefix + node)"));
    }
  }
  if (auto n = node["lease_ttl"]) {
    // etcd counts lease TTLs in whole seconds, and raises one below its minimum (about 1.5 x
    // its election timeout, 2 s with defaults) silently.
    ASSIGN_OR_RETURN(d.lease_ttl, ReadDuration(ctx, n, "discovery.lease_ttl", absl::Seconds(2),
                                               absl::Hours(1)));
    if (d.lease_ttl != absl::Seconds(absl::ToInt64Seconds(d.lease_ttl))) {
      return ctx.Error(n, "discovery.lease_ttl", "etcd leases count whole seconds");
    }
  }
  if (auto n = node["advertise"]) {
    ASSIGN_OR_RETURN(d.advertise, ReadString(ctx, n, "discovery.advertise"));
    absl::Status valid = ValidateAddress(d.advertise, /*allow_port_0=*/false);
    if (!valid.ok()) return ctx.Error(n, "discovery.advertise", valid.message());
  }
  return absl::OkStatus();
}

absl::Status ParsePolicySection(const Context& ctx, const YAML::Node& node, Policy& policy) {
  RETURN_IF_ERROR(CheckKeys(ctx, node, "policy",
                            {"gdr", "gdr_max_path", "fallback", "staging_chunk", "staging_depth"}));
  for (const auto& item : node) {
    std::string key = item.first.as<std::string>();
    std::string full = absl::StrCat("policy.", key);
    ASSIGN_OR_RETURN(std::string value, ReadString(ctx, item.second, full));
    absl::Status s = ApplyPolicySetting(key, value, policy);
    if (!s.ok()) return ctx.Error(item.second, full, s.message());
  }
  return absl::OkStatus();
}

absl::Status ParseSecuritySection(const Context& ctx, const YAML::Node& node,
                                  SecuritySettings& s) {
  RETURN_IF_ERROR(
      CheckKeys(ctx, node, "security",
                {"mode", "ca", "cert", "key", "allow_insecure_remote", "admin_group"}));
  if (auto n = node["admin_group"]) {
    ASSIGN_OR_RETURN(s.admin_group, ReadString(ctx, n, "security.admin_group"));
  }
  s.implicit = false;
  if (auto n = node["mode"]) {
    ASSIGN_OR_RETURN(s.mode, ReadString(ctx, n, "security.mode"));
    if (s.mode != "mtls" && s.mode != "insecure") {
      return ctx.Error(n, "security.mode", absl::StrCat(Echo(s.mode), " is not mtls or insecure"));
    }
  }
  for (auto [key, field] : {std::pair{"ca", &s.ca}, {"cert", &s.cert}, {"key", &s.key}}) {
    if (auto n = node[key]) {
      ASSIGN_OR_RETURN(*field, ReadString(ctx, n, absl::StrCat("security.", key)));
    }
    if (s.tls() && field->empty()) {
      return ctx.Error(node, absl::StrCat("security.", key),
                       "needed for security.mode mtls (a PEM file; or security.mode: insecure)");
    }
  }
  if (auto n = node["allow_insecure_remote"]) {
    if (!n.IsScalar() || (n.as<std::string>() != "true" && n.as<std::string>() != "false")) {
      return ctx.Error(n, "security.allow_insecure_remote", "expected true or false");
    }
    s.allow_insecure_remote = n.as<std::string>() == "true";
  }
  return absl::OkStatus();
}

absl::Status ParseInto(const Context& ctx, const YAML::Node& root, Config& c) {
  if (!root || root.IsNull()) return absl::OkStatus();  // empty file: all defaults
  RETURN_IF_ERROR(CheckKeys(ctx, root, "",
                            {"node", "listen", "peers", "discovery", "host_pool", "providers",
                             "tcp", "verbs", "limits", "log", "topology", "nics", "policy",
                             "gpu", "metrics", "security"}));
  if (auto n = root["node"]) {
    ASSIGN_OR_RETURN(c.node, ReadString(ctx, n, "node"));
    absl::Status valid = ValidateNodeName(c.node);
    if (!valid.ok()) return ctx.Error(n, "node", valid.message());
  }
  if (auto listen = root["listen"]) {
    RETURN_IF_ERROR(CheckKeys(ctx, listen, "listen",
                              {"local", "local_tcp", "peer", "local_mode", "local_group"}));
    if (auto n = listen["local_mode"]) {
      // Octal, as chmod takes it; the owner keeps read and write (the agent itself).
      ASSIGN_OR_RETURN(std::string text, ReadString(ctx, n, "listen.local_mode"));
      char* end = nullptr;
      unsigned long mode = std::strtoul(text.c_str(), &end, 8);
      if (text.empty() || *end != '\0' || mode > 0777 || (mode & 0600) != 0600) {
        return ctx.Error(
            n, "listen.local_mode",
            absl::StrCat(Echo(text), " is not an octal mode with owner rw (e.g. 0660)"));
      }
      c.local_socket_mode = static_cast<uint32_t>(mode);
    }
    if (auto n = listen["local_group"]) {
      ASSIGN_OR_RETURN(c.local_socket_group, ReadString(ctx, n, "listen.local_group"));
    }
    if (auto n = listen["local"]) {
      ASSIGN_OR_RETURN(c.local_socket, ReadString(ctx, n, "listen.local"));
    }
    if (auto n = listen["local_tcp"]) {
      ASSIGN_OR_RETURN(c.local_tcp, ReadString(ctx, n, "listen.local_tcp"));
      if (!c.local_tcp.empty())
        RETURN_IF_ERROR(CheckAddress(ctx, n, "listen.local_tcp", c.local_tcp));
    }
    if (auto n = listen["peer"]) {
      ASSIGN_OR_RETURN(c.peer_listen, ReadString(ctx, n, "listen.peer"));
      RETURN_IF_ERROR(CheckAddress(ctx, n, "listen.peer", c.peer_listen));
    }
  }
  if (auto peers = root["peers"]) {
    if (!peers.IsMap() && !peers.IsNull())
      return ctx.Error(peers, "peers", "expected name: host:port pairs");
    for (const auto& item : peers) {
      std::string name = item.first.as<std::string>();
      std::string key = absl::StrCat("peers.", name);
      ASSIGN_OR_RETURN(std::string address, ReadString(ctx, item.second, key));
      RETURN_IF_ERROR(CheckAddress(ctx, item.second, key, address));
      c.peers[name] = address;
    }
  }
  if (auto n = root["discovery"]) {
    RETURN_IF_ERROR(ParseDiscoverySection(ctx, n, c.discovery));
    // A wildcard listener is no address to dial: peers need the one to register.
    const std::string host = c.peer_listen.substr(0, c.peer_listen.rfind(':'));
    if (c.discovery.advertise.empty() && (host == "0.0.0.0" || host == "[::]" || host.empty())) {
      return ctx.Error(n, "discovery.advertise",
                       absl::StrCat("needed: listen.peer (", c.peer_listen,
                                    ") is on every address; name the host:port peers dial"));
    }
  }
  if (auto pool = root["host_pool"]) {
    RETURN_IF_ERROR(CheckKeys(ctx, pool, "host_pool", {"size", "numa"}));
    if (auto n = pool["numa"]) {
      ASSIGN_OR_RETURN(uint32_t numa, ReadCount(ctx, n, "host_pool.numa", 0, 1023));
      c.host_pool_numa = static_cast<int>(numa);
    }
    if (auto n = pool["size"]) {
      ASSIGN_OR_RETURN(c.host_pool_bytes, ReadByteSize(ctx, n, "host_pool.size"));
      if (c.host_pool_bytes < (1u << 20))
        return ctx.Error(n, "host_pool.size", "must be at least 1 MiB");
    }
  }
  if (auto n = root["providers"]) {
    ASSIGN_OR_RETURN(c.providers, ReadStringList(ctx, n, "providers"));
    std::set<std::string> seen;
    for (const auto& p : c.providers) {
      if (p != "tcp" && p != "verbs") {
        return ctx.Error(n, "providers",
                         absl::StrCat("unknown provider '", p, "' (expected verbs or tcp)"));
      }
      if (!seen.insert(p).second)
        return ctx.Error(n, "providers", absl::StrCat("'", p, "' is listed twice"));
    }
    if (c.providers.empty()) return ctx.Error(n, "providers", "must list at least one provider");
  }
  if (auto tcp = root["tcp"]) {
    RETURN_IF_ERROR(CheckKeys(ctx, tcp, "tcp", {"connections", "listen", "rails"}));
    if (auto rails = tcp["rails"]) {
      if (rails.IsScalar() && rails.as<std::string>() == "auto") {
        c.tcp_rails_auto = true;
      } else if (!rails.IsMap() && !rails.IsNull()) {
        return ctx.Error(rails, "tcp.rails",
                         "expected auto or nic: address pairs (mlx5_0: 10.0.0.1)");
      } else {
        for (const auto& item : rails) {
          std::string nic = item.first.as<std::string>();
          std::string key = absl::StrCat("tcp.rails.", nic);
          ASSIGN_OR_RETURN(std::string address, ReadString(ctx, item.second, key));
          // A bare host listens on any free port of it.
          if (address.find(':') == std::string::npos) address = absl::StrCat(address, ":0");
          RETURN_IF_ERROR(CheckAddress(ctx, item.second, key, address));
          c.tcp_rails[nic] = address;
        }
      }
    }
    if (auto n = tcp["connections"]) {
      // 63: a session admits 64 sockets, and one is the express connection (tcp_fabric.h).
      ASSIGN_OR_RETURN(c.tcp_connections, ReadCount(ctx, n, "tcp.connections", 1, 63));
    }
    if (auto n = tcp["listen"]) {
      ASSIGN_OR_RETURN(c.tcp_listen, ReadString(ctx, n, "tcp.listen"));
      RETURN_IF_ERROR(CheckAddress(ctx, n, "tcp.listen", c.tcp_listen));
    }
  }
  if (auto verbs = root["verbs"]) {
    RETURN_IF_ERROR(CheckKeys(ctx, verbs, "verbs",
                              {"device", "port", "gid_index", "timeout", "retry_cnt", "rnr_retry",
                               "send_queue_depth", "signal_every", "inline_threshold",
                               "recv_queue_depth", "cq_depth", "max_message_bytes",
                               "traffic_class", "sl", "pkey_index", "qps_per_peer"}));
    VerbsSettings& v = c.verbs;
    if (auto n = verbs["device"]) {
      ASSIGN_OR_RETURN(v.device, ReadString(ctx, n, "verbs.device"));
    }
    if (auto n = verbs["port"]) {
      ASSIGN_OR_RETURN(v.port, ReadCount(ctx, n, "verbs.port", 0, 255));
    }
    if (auto n = verbs["gid_index"]) {
      // -1 (auto) is the one value below zero, hence not ReadCount.
      int index = 0;
      if (!n.IsScalar() || !absl::SimpleAtoi(n.as<std::string>(), &index)) {
        return ctx.Error(n, "verbs.gid_index", "expected a whole number (-1 = auto)");
      }
      if (index < -1 || index > 255) {
        return ctx.Error(n, "verbs.gid_index", absl::StrCat(index, " is outside -1..255"));
      }
      v.gid_index = index;
    }
    if (auto n = verbs["timeout"]) {
      ASSIGN_OR_RETURN(v.timeout, ReadCount(ctx, n, "verbs.timeout", 0, 31));
    }
    if (auto n = verbs["retry_cnt"]) {
      ASSIGN_OR_RETURN(v.retry_cnt, ReadCount(ctx, n, "verbs.retry_cnt", 0, 7));
    }
    if (auto n = verbs["rnr_retry"]) {
      ASSIGN_OR_RETURN(v.rnr_retry, ReadCount(ctx, n, "verbs.rnr_retry", 0, 7));
    }
    if (auto n = verbs["send_queue_depth"]) {
      ASSIGN_OR_RETURN(v.send_queue_depth,
                       ReadCount(ctx, n, "verbs.send_queue_depth", 1, 1u << 16));
    }
    if (auto n = verbs["signal_every"]) {
      ASSIGN_OR_RETURN(v.signal_every, ReadCount(ctx, n, "verbs.signal_every", 1, 1u << 16));
    }
    if (auto n = verbs["inline_threshold"]) {
      ASSIGN_OR_RETURN(v.inline_threshold, ReadCount(ctx, n, "verbs.inline_threshold", 0, 1024));
    }
    if (auto n = verbs["recv_queue_depth"]) {
      ASSIGN_OR_RETURN(v.recv_queue_depth,
                       ReadCount(ctx, n, "verbs.recv_queue_depth", 1, 1u << 16));
    }
    if (auto n = verbs["cq_depth"]) {
      // 2^22 is above any HCA's max_cqe (mlx5: 2^22 - 1), which clamps it anyway.
      ASSIGN_OR_RETURN(v.cq_depth, ReadCount(ctx, n, "verbs.cq_depth", 1, 1u << 22));
      // Each queue pair reserves its whole queue in one CQ (transport/verbs/cq_pool.h): a CQ
      // smaller than one queue would refuse every peer. Checked only when the key is given:
      // the default beside send_queue_depth 65536, valid before, would fail it.
      const uint64_t one_queue = std::max(v.send_queue_depth, v.recv_queue_depth);
      if (v.cq_depth < one_queue) {
        return ctx.Error(n, "verbs.cq_depth", absl::StrCat(
            v.cq_depth, " is less than max(send_queue_depth, recv_queue_depth) (", one_queue,
            "): not one connection would fit"));
      }
    }
    if (auto n = verbs["max_message_bytes"]) {
      ASSIGN_OR_RETURN(v.max_message_bytes, ReadByteSize(ctx, n, "verbs.max_message_bytes"));
      // Below a page per work request is a slip of the unit (4 for 4KiB), not a tuning.
      if (v.max_message_bytes != 0 && v.max_message_bytes < 4096) {
        return ctx.Error(n, "verbs.max_message_bytes",
                         "must be 0 (the port's max_msg_sz) or at least 4KiB");
      }
    }
    // QoS and partition: what the fabric's lossless class and partitions are set up for
    // (a RoCE fabric with PFC/ECN on DSCP 26 wants traffic_class 106, as NCCL_IB_TC).
    if (auto n = verbs["traffic_class"]) {
      ASSIGN_OR_RETURN(v.traffic_class, ReadCount(ctx, n, "verbs.traffic_class", 0, 255));
    }
    if (auto n = verbs["sl"]) {
      ASSIGN_OR_RETURN(v.sl, ReadCount(ctx, n, "verbs.sl", 0, 15));
    }
    if (auto n = verbs["pkey_index"]) {
      ASSIGN_OR_RETURN(v.pkey_index, ReadCount(ctx, n, "verbs.pkey_index", 0, 65535));
    }
    if (auto n = verbs["qps_per_peer"]) {
      ASSIGN_OR_RETURN(v.qps_per_peer, ReadCount(ctx, n, "verbs.qps_per_peer", 1, 16));
    }
    if (v.signal_every > v.send_queue_depth) {
      return ctx.Error(verbs, "verbs.signal_every", absl::StrCat(
          v.signal_every, " exceeds send_queue_depth ", v.send_queue_depth,
          ": the send queue would fill before a completion frees it"));
    }
  }
  if (auto limits = root["limits"]) {
    RETURN_IF_ERROR(CheckKeys(
        ctx, limits, "limits",
        {"max_op_bytes", "max_ops_per_submit", "default_timeout_ms", "max_timeout_ms",
         "slice_bytes", "peer_window_bytes", "tcp_max_connections", "tcp_max_connections_per_peer",
         "tcp_handshake_timeout_ms", "shutdown_grace_ms", "per_uid_transfers",
         "per_uid_registrations", "per_uid_buffers", "notifications_per_receiver"}));
    for (auto [key, field] : {std::pair{"per_uid_transfers", &c.per_uid_transfers},
                              std::pair{"per_uid_registrations", &c.per_uid_registrations},
                              std::pair{"per_uid_buffers", &c.per_uid_buffers}}) {
      if (auto n = limits[key]) {
        ASSIGN_OR_RETURN(*field, ReadCount(ctx, n, absl::StrCat("limits.", key), 0, 1u << 24));
      }
    }
    if (auto n = limits["notifications_per_receiver"]) {
      ASSIGN_OR_RETURN(c.notifications_per_receiver,
                       ReadCount(ctx, n, "limits.notifications_per_receiver", 1, 1u << 24));
    }
    if (auto n = limits["max_op_bytes"]) {
      ASSIGN_OR_RETURN(c.max_op_bytes, ReadByteSize(ctx, n, "limits.max_op_bytes"));
      if (c.max_op_bytes == 0) return ctx.Error(n, "limits.max_op_bytes", "must be positive");
    }
    if (auto n = limits["max_ops_per_submit"]) {
      ASSIGN_OR_RETURN(c.max_ops_per_submit,
                       ReadCount(ctx, n, "limits.max_ops_per_submit", 1, 1u << 20));
    }
    if (auto n = limits["default_timeout_ms"]) {
      ASSIGN_OR_RETURN(c.default_timeout_ms,
                       ReadCount(ctx, n, "limits.default_timeout_ms", 1, 86400000));
    }
    if (auto n = limits["max_timeout_ms"]) {
      ASSIGN_OR_RETURN(c.max_timeout_ms, ReadCount(ctx, n, "limits.max_timeout_ms", 1, 86400000));
    }
    if (auto n = limits["slice_bytes"]) {
      ASSIGN_OR_RETURN(c.slice_bytes, ReadByteSize(ctx, n, "limits.slice_bytes"));
      if (c.slice_bytes < 4096) return ctx.Error(n, "limits.slice_bytes", "must be at least 4KiB");
    }
    if (auto n = limits["peer_window_bytes"]) {
      ASSIGN_OR_RETURN(c.peer_window_bytes, ReadByteSize(ctx, n, "limits.peer_window_bytes"));
      if (c.peer_window_bytes == 0)
        return ctx.Error(n, "limits.peer_window_bytes", "must be positive");
    }
    if (auto n = limits["tcp_max_connections"]) {
      ASSIGN_OR_RETURN(c.tcp_max_connections,
                       ReadCount(ctx, n, "limits.tcp_max_connections", 1, 1u << 20));
    }
    if (auto n = limits["tcp_max_connections_per_peer"]) {
      ASSIGN_OR_RETURN(c.tcp_max_connections_per_peer,
                       ReadCount(ctx, n, "limits.tcp_max_connections_per_peer", 1, 1u << 20));
    }
    if (auto n = limits["tcp_handshake_timeout_ms"]) {
      ASSIGN_OR_RETURN(c.tcp_handshake_timeout_ms,
                       ReadCount(ctx, n, "limits.tcp_handshake_timeout_ms", 1, 600000));
    }
    if (auto n = limits["shutdown_grace_ms"]) {
      // "30s" is the likely slip: say what to write instead.
      absl::Duration d;
      if (n.IsScalar() && absl::ParseDuration(n.as<std::string>(), &d) &&
          d >= absl::ZeroDuration()) {
        uint32_t ms = 0;
        if (!absl::SimpleAtoi(n.as<std::string>(), &ms)) {
          return ctx.Error(n, "limits.shutdown_grace_ms",
                           absl::StrCat("expected milliseconds as a whole number: write ",
                                        absl::ToInt64Milliseconds(d), " for ",
                                        n.as<std::string>()));
        }
      }
      // An hour at most: systemd's TimeoutStopSec and Kubernetes'
      // terminationGracePeriodSeconds must cover it, or the agent is killed mid-drain.
      ASSIGN_OR_RETURN(c.shutdown_grace_ms,
                       ReadCount(ctx, n, "limits.shutdown_grace_ms", 0, 3600000));
    }
  }
  if (auto n = root["security"]) RETURN_IF_ERROR(ParseSecuritySection(ctx, n, c.security));
  if (auto metrics = root["metrics"]) {
    RETURN_IF_ERROR(CheckKeys(ctx, metrics, "metrics", {"listen"}));
    if (auto n = metrics["listen"]) {
      ASSIGN_OR_RETURN(c.metrics_listen, ReadString(ctx, n, "metrics.listen"));
      if (!c.metrics_listen.empty())
        RETURN_IF_ERROR(CheckAddress(ctx, n, "metrics.listen", c.metrics_listen));
    }
  }
  if (auto log = root["log"]) {
    RETURN_IF_ERROR(CheckKeys(ctx, log, "log", {"level", "format"}));
    if (auto n = log["format"]) {
      ASSIGN_OR_RETURN(c.log_format, ReadString(ctx, n, "log.format"));
      if (c.log_format != "text" && c.log_format != "json") {
        return ctx.Error(n, "log.format", absl::StrCat("'", c.log_format, "' is not text or json"));
      }
    }
    if (auto n = log["level"]) {
      ASSIGN_OR_RETURN(c.log_level, ReadString(ctx, n, "log.level"));
      if (absl::Status valid = ValidateLogLevel(c.log_level); !valid.ok()) {
        return ctx.Error(n, "log.level", std::string(valid.message()));
      }
    }
  }
  if (auto n = root["topology"]) {
    ASSIGN_OR_RETURN(c.topology, ReadString(ctx, n, "topology"));
  }
  if (auto nics = root["nics"]) {
    RETURN_IF_ERROR(CheckKeys(ctx, nics, "nics", {"allow", "deny"}));
    if (auto n = nics["allow"]) {
      ASSIGN_OR_RETURN(c.nics.allow, ReadStringList(ctx, n, "nics.allow"));
    }
    if (auto n = nics["deny"]) {
      ASSIGN_OR_RETURN(c.nics.deny, ReadStringList(ctx, n, "nics.deny"));
    }
  }
  if (auto n = root["policy"]) RETURN_IF_ERROR(ParsePolicySection(ctx, n, c.policy));
  if (auto gpu = root["gpu"]) {
    RETURN_IF_ERROR(CheckKeys(ctx, gpu, "gpu", {"backend", "count", "pool_size", "sim_copy_rate"}));
    if (auto n = gpu["backend"]) {
      ASSIGN_OR_RETURN(c.gpu_backend, ReadString(ctx, n, "gpu.backend"));
      if (c.gpu_backend != "auto" && c.gpu_backend != "cuda" && c.gpu_backend != "sim" &&
          c.gpu_backend != "none") {
        return ctx.Error(n, "gpu.backend",
                         absl::StrCat("'", c.gpu_backend, "' is not one of auto, cuda, sim, none"));
      }
    }
    if (auto n = gpu["count"]) {
      ASSIGN_OR_RETURN(c.gpu_sim_count, ReadCount(ctx, n, "gpu.count", 0, 64));
    }
    if (auto n = gpu["pool_size"]) {
      ASSIGN_OR_RETURN(c.gpu_pool_bytes, ReadByteSize(ctx, n, "gpu.pool_size"));
      if (c.gpu_pool_bytes < (1u << 20))
        return ctx.Error(n, "gpu.pool_size", "must be at least 1 MiB");
    }
    if (auto n = gpu["sim_copy_rate"]) {
      // Bytes per second, e.g. "2GiB" for 2 GiB/s.
      ASSIGN_OR_RETURN(c.gpu_sim_copy_bytes_per_sec, ReadByteSize(ctx, n, "gpu.sim_copy_rate"));
    }
    if (c.gpu_backend != "sim" && c.gpu_sim_count > 0) {
      return ctx.Error(gpu, "gpu.count", "only applies to gpu.backend: sim");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<YAML::Node> ParseYaml(absl::string_view yaml, absl::string_view origin) {
  try {
    return YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ":", e.mark.line + 1, ": malformed YAML: ", e.msg));
  }
}

}  // namespace

absl::StatusOr<Config> ParseConfig(absl::string_view yaml, absl::string_view origin) {
  Context ctx(origin);
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(yaml, origin));
  Config config;
  try {
    RETURN_IF_ERROR(ParseInto(ctx, root, config));
    absl::Status reach = CheckSecurityReach(config);
    if (!reach.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", reach.message()));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ":", e.mark.line + 1, ": ", e.msg));
  }
  return config;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("config file: ", text.status().message()));
  }
  ASSIGN_OR_RETURN(Config config, ParseConfig(*text, path));
  config.source_path = path;
  return config;
}

void ResolveDefaults(Config& config) {
  if (config.node.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') {
      config.node = host;
    } else {
      config.node = "localhost";
    }
  }
  if (config.local_socket.empty())
    config.local_socket = absl::StrCat("/tmp/ferryd-", config.node, ".sock");
  // A relative socket path is relative to where the agent started; clients and the
  // agent's own lock need the absolute one.
  if (config.local_socket.front() != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) != nullptr)
      config.local_socket = absl::StrCat(cwd, "/", config.local_socket);
  }
}

absl::Status ValidateNodeName(const std::string& node) {
  if (node.empty() || node.size() > 253 || node.find_first_of(":/ \t\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        node.empty() ? "''" : Echo(node), " must be non-empty without ':', '/' or spaces"));
  }
  return absl::OkStatus();
}

absl::Status ValidateAddress(const std::string& address, bool allow_port_0) {
  size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < (allow_port_0 ? 0 : 1) ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(Echo(address), " is not host:port"));
  }
  return absl::OkStatus();
}

absl::Status CheckSecurityReach(const Config& c) {
  const SecuritySettings& s = c.security;
  // A TCP port is open to every local user (and, off loopback, beyond): the local API
  // there takes only callers with a certificate of the CA, never plaintext.
  if (!c.local_tcp.empty() && !s.tls()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'listen.local_tcp': the local API over TCP needs mutual TLS (security.mode mtls "
        "with security.ca, cert and key); the Unix socket needs none"));
  }
  if (s.tls() || s.allow_insecure_remote) return absl::OkStatus();
  const std::string remedy =
      s.implicit ? "configure security.ca, security.cert and security.key (mutual TLS)"
                 : "use security.mode: mtls, or set security.allow_insecure_remote: true";
  auto refuse = [&](absl::string_view key, const std::string& address) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", key, "': ", Echo(address), " is not loopback and the Peer API would be "
        "plaintext there (", s.implicit ? "no security section" : "security.mode: insecure",
        "): ", remedy));
  };
  if (!IsLoopbackAddress(c.peer_listen)) return refuse("listen.peer", c.peer_listen);
  for (const auto& [name, address] : c.peers) {
    if (!IsLoopbackAddress(address)) return refuse(absl::StrCat("peers.", name), address);
  }
  if (c.discovery.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'discovery': peers found through etcd may be anywhere and the Peer API would be "
        "plaintext: ", remedy));
  }
  return absl::OkStatus();
}

bool IsLoopbackAddress(const std::string& address) {
  size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status ValidateLogLevel(const std::string& level) {
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
  if (kLevels.count(level)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", level.substr(0, 32), "' is not one of trace, debug, info, warn, error"));
}

absl::StatusOr<Policy> LoadPolicyFromFile(const std::string& path) {
  ASSIGN_OR_RETURN(Config config, LoadConfigFile(path));
  return config.policy;
}

}  // namespace ferry::config
