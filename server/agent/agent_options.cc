#include "server/agent/agent_options.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "transport/tcp/socket.h"

namespace ferry::server {
namespace {

// The data listener defaults to the peer API's host on any free port; Hello tells peers.
std::string TcpListenAddress(const config::Config& config) {
  if (!config.tcp_listen.empty()) return config.tcp_listen;
  auto hp = tcp::ParseHostPort(config.peer_listen);
  std::string host = hp.ok() ? hp->host : "127.0.0.1";
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  return absl::StrCat(host, ":0");
}

}  // namespace

tcp::TcpOptions TcpRailOptions(const tcp::TcpOptions& base, const std::string& nic,
                               const std::string& address) {
  tcp::TcpOptions rail = base;
  rail.listen_address = address;
  rail.nic = nic;
  rail.event_loops = 1;
  return rail;
}

fabric::ProviderOptions ProviderOptionsFromConfig(const config::Config& config,
                                                  uint64_t connection_fd_budget,
                                                  std::string* clamp_note) {
  if (clamp_note != nullptr) clamp_note->clear();
  fabric::ProviderOptions providers;
  providers.providers = config.providers;

  tcp::TcpOptions& tcp = providers.tcp;
  tcp.listen_address = TcpListenAddress(config);
  tcp.connections = config.tcp_connections;
  tcp.max_connections =
      static_cast<uint32_t>(std::min<uint64_t>(config.tcp_max_connections, connection_fd_budget));
  if (tcp.max_connections < config.tcp_max_connections && clamp_note != nullptr) {
    *clamp_note = absl::StrCat("tcp: at most ", tcp.max_connections,
                               " incoming connections (limits.tcp_max_connections ",
                               config.tcp_max_connections,
                               " is more than the open-file limit allows)");
  }
  tcp.max_connections_per_source = config.tcp_max_connections_per_peer;
  tcp.handshake_timeout_ms = config.tcp_handshake_timeout_ms;
  // stripe_min_bytes, express_max_bytes and event_loops have no config key: their defaults
  // stand, but rails share the cores: one loop per direction each.
  for (const auto& [nic, address] : config.tcp_rails) {
    providers.tcp_rails.push_back(TcpRailOptions(tcp, nic, address));
  }

  // Designated, in declaration order: the compiler refuses a field out of place.
  const config::VerbsSettings& v = config.verbs;
  providers.verbs = verbs::VerbsOptions{.device = v.device,
                                        .port = v.port,
                                        .gid_index = v.gid_index,
                                        .timeout = v.timeout,
                                        .retry_cnt = v.retry_cnt,
                                        .rnr_retry = v.rnr_retry,
                                        .send_queue_depth = v.send_queue_depth,
                                        .signal_every = v.signal_every,
                                        .inline_threshold = v.inline_threshold,
                                        .recv_queue_depth = v.recv_queue_depth,
                                        .cq_depth = v.cq_depth,
                                        .max_message_bytes = v.max_message_bytes,
                                        .traffic_class = static_cast<uint8_t>(v.traffic_class),
                                        .sl = static_cast<uint8_t>(v.sl),
                                        .pkey_index = static_cast<uint16_t>(v.pkey_index),
                                        .qps_per_peer = v.qps_per_peer};
  return providers;
}

EngineLimits EngineLimitsFromConfig(const config::Config& config) {
  EngineLimits limits;
  limits.max_op_bytes = config.max_op_bytes;
  limits.max_ops_per_submit = config.max_ops_per_submit;
  limits.default_timeout = absl::Milliseconds(config.default_timeout_ms);
  limits.max_timeout = absl::Milliseconds(config.max_timeout_ms);
  limits.slice_bytes = config.slice_bytes;
  limits.peer_window_bytes = config.peer_window_bytes;
  limits.shutdown_grace = absl::Milliseconds(config.shutdown_grace_ms);
  limits.per_uid_transfers = config.per_uid_transfers;
  return limits;
}

}  // namespace ferry::server
