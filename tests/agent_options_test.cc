#include "server/agent/agent_options.h"

#include <cstddef>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "config/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;

// Converts to the type of any field, so that T{AnyField{}, ...} compiles while T has at least
// as many fields as there are initializers. Declared only: used in unevaluated contexts.
struct AnyField {
  template <typename T>
  operator T() const;  // NOLINT(google-explicit-constructor): implicit is the point
};

// The number of fields of the aggregate T.
template <typename T, typename... Fields>
constexpr size_t FieldCount() {
  if constexpr (requires { T{Fields{}..., AnyField{}}; }) {
    return FieldCount<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}

// A field added to these structs compiles, defaults, and silently never arrives from the
// config file: the reason server/agent/agent_options.cc exists (issue 11). Counting the fields
// stops the build until the new one is mapped there (or said to have no key) and checked
// below. The count, not sizeof: sizeof changes with the standard library and padding, and
// not when a uint32_t joins a struct with room to spare.
static_assert(FieldCount<tcp::TcpOptions>() == 9,
              "new field: map it in server/agent/agent_options.cc and test it here");
static_assert(FieldCount<verbs::VerbsOptions>() == 16,
              "new field: map it in server/agent/agent_options.cc and test it here");
static_assert(FieldCount<fabric::ProviderOptions>() == 5,
              "new field: map it in server/agent/agent_options.cc and test it here");
static_assert(FieldCount<EngineLimits>() == 10,
              "new field: map it in server/agent/agent_options.cc and test it here");

// Every key that maps to a provider or engine option, each set to a value that is neither
// its default nor any other key's value, so that a crossed wire shows.
constexpr char kEveryKey[] = R"(
listen:
  peer: 10.1.2.3:7300
providers: [tcp, verbs]
tcp:
  connections: 7
  listen: 10.9.8.7:7400
  rails:
    mlx5_0: 10.0.0.1
    mlx5_1: 10.0.1.1:7500
verbs:
  device: mlx5_3
  port: 2
  gid_index: 5
  timeout: 20
  retry_cnt: 3
  rnr_retry: 4
  send_queue_depth: 512
  signal_every: 16
  inline_threshold: 128
  recv_queue_depth: 100
  cq_depth: 9999
  max_message_bytes: 1MiB
  traffic_class: 106
  sl: 3
  pkey_index: 2
  qps_per_peer: 3
limits:
  max_op_bytes: 2GiB
  max_ops_per_submit: 1000
  default_timeout_ms: 30000
  max_timeout_ms: 90000
  slice_bytes: 256KiB
  peer_window_bytes: 8MiB
  tcp_max_connections: 3000
  tcp_max_connections_per_peer: 17
  tcp_handshake_timeout_ms: 1234
  shutdown_grace_ms: 4321
  per_uid_transfers: 77
security:
  ca: /etc/ferry/ca.pem
  cert: /etc/ferry/node.pem
  key: /etc/ferry/node.key
)";

constexpr uint64_t kAmpleFds = 1 << 20;

config::Config Parse(const std::string& yaml) {
  auto c = config::ParseConfig(yaml, "test.yaml");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : config::Config{};
}

TEST(AgentOptionsTest, EveryProviderKeyArrives) {
  std::string note = "stale";
  const fabric::ProviderOptions p =
      ProviderOptionsFromConfig(Parse(kEveryKey), kAmpleFds, &note);
  EXPECT_EQ(note, "");
  EXPECT_EQ(p.providers, (std::vector<std::string>{"tcp", "verbs"}));

  const tcp::TcpOptions defaults;
  EXPECT_EQ(p.tcp.listen_address, "10.9.8.7:7400");
  EXPECT_EQ(p.tcp.connections, 7u);
  EXPECT_EQ(p.tcp.max_connections, 3000u);
  EXPECT_EQ(p.tcp.max_connections_per_source, 17u);
  EXPECT_EQ(p.tcp.handshake_timeout_ms, 1234u);
  // No config key: the provider's defaults.
  EXPECT_EQ(p.tcp.stripe_min_bytes, defaults.stripe_min_bytes);
  EXPECT_EQ(p.tcp.express_max_bytes, defaults.express_max_bytes);
  EXPECT_EQ(p.tcp.event_loops, defaults.event_loops);

  EXPECT_EQ(p.verbs.device, "mlx5_3");
  EXPECT_EQ(p.verbs.port, 2u);
  EXPECT_EQ(p.verbs.gid_index, 5);
  EXPECT_EQ(p.verbs.timeout, 20u);
  EXPECT_EQ(p.verbs.retry_cnt, 3u);
  EXPECT_EQ(p.verbs.rnr_retry, 4u);
  EXPECT_EQ(p.verbs.send_queue_depth, 512u);
  EXPECT_EQ(p.verbs.signal_every, 16u);
  EXPECT_EQ(p.verbs.inline_threshold, 128u);
  EXPECT_EQ(p.verbs.recv_queue_depth, 100u);
  EXPECT_EQ(p.verbs.cq_depth, 9999u);
  EXPECT_EQ(p.verbs.max_message_bytes, 1u << 20);
  EXPECT_EQ(p.verbs.traffic_class, 106);
  EXPECT_EQ(p.verbs.sl, 3);
  EXPECT_EQ(p.verbs.pkey_index, 2);
  EXPECT_EQ(p.verbs.qps_per_peer, 3u);
  // The topology's NICs, filled by the agent, not by a key.
  EXPECT_TRUE(p.verbs_devices.empty());

  // A rail each: the tcp options with that NIC's address and name, one loop per direction.
  ASSERT_EQ(p.tcp_rails.size(), 2u);
  EXPECT_EQ(p.tcp_rails[0].nic, "mlx5_0");
  EXPECT_EQ(p.tcp_rails[0].listen_address, "10.0.0.1:0");
  EXPECT_EQ(p.tcp_rails[1].nic, "mlx5_1");
  EXPECT_EQ(p.tcp_rails[1].listen_address, "10.0.1.1:7500");
  for (const tcp::TcpOptions& rail : p.tcp_rails) {
    EXPECT_EQ(rail.connections, 7u);
    EXPECT_EQ(rail.max_connections, 3000u);
    EXPECT_EQ(rail.event_loops, 1u);
  }
  EXPECT_EQ(p.tcp.nic, "");
}

TEST(AgentOptionsTest, EveryEngineKeyArrives) {
  const EngineLimits limits = EngineLimitsFromConfig(Parse(kEveryKey));
  EXPECT_EQ(limits.max_op_bytes, 2ull << 30);
  EXPECT_EQ(limits.max_ops_per_submit, 1000u);
  EXPECT_EQ(limits.default_timeout, absl::Milliseconds(30000));
  EXPECT_EQ(limits.max_timeout, absl::Milliseconds(90000));
  EXPECT_EQ(limits.slice_bytes, 256u << 10);
  EXPECT_EQ(limits.peer_window_bytes, 8u << 20);
  EXPECT_EQ(limits.shutdown_grace, absl::Milliseconds(4321));
  EXPECT_EQ(limits.per_uid_transfers, 77u);
  // No config key: the engine's defaults.
  EXPECT_EQ(limits.history, EngineLimits{}.history);
  EXPECT_EQ(limits.history_ops, EngineLimits{}.history_ops);
}

// An empty file gives the options' own defaults, so the two sets of defaults (config.h and
// the option structs) cannot drift apart unnoticed.
TEST(AgentOptionsTest, ConfigDefaultsAreTheOptionDefaults) {
  const fabric::ProviderOptions p = ProviderOptionsFromConfig(Parse(""), kAmpleFds);
  const tcp::TcpOptions tcp;
  EXPECT_EQ(p.providers, (std::vector<std::string>{"verbs", "tcp"}));
  EXPECT_EQ(p.tcp.listen_address, tcp.listen_address);  // peer API 127.0.0.1:7100
  EXPECT_EQ(p.tcp.connections, tcp.connections);
  EXPECT_EQ(p.tcp.max_connections, tcp.max_connections);
  EXPECT_EQ(p.tcp.max_connections_per_source, tcp.max_connections_per_source);
  EXPECT_EQ(p.tcp.handshake_timeout_ms, tcp.handshake_timeout_ms);
  const verbs::VerbsOptions verbs;
  EXPECT_EQ(p.verbs.device, verbs.device);
  EXPECT_EQ(p.verbs.port, verbs.port);
  EXPECT_EQ(p.verbs.gid_index, verbs.gid_index);
  EXPECT_EQ(p.verbs.timeout, verbs.timeout);
  EXPECT_EQ(p.verbs.retry_cnt, verbs.retry_cnt);
  EXPECT_EQ(p.verbs.rnr_retry, verbs.rnr_retry);
  EXPECT_EQ(p.verbs.send_queue_depth, verbs.send_queue_depth);
  EXPECT_EQ(p.verbs.signal_every, verbs.signal_every);
  EXPECT_EQ(p.verbs.inline_threshold, verbs.inline_threshold);
  EXPECT_EQ(p.verbs.recv_queue_depth, verbs.recv_queue_depth);
  EXPECT_EQ(p.verbs.cq_depth, verbs.cq_depth);
  EXPECT_EQ(p.verbs.max_message_bytes, verbs.max_message_bytes);
  EXPECT_EQ(p.verbs.traffic_class, verbs.traffic_class);
  EXPECT_EQ(p.verbs.sl, verbs.sl);
  EXPECT_EQ(p.verbs.pkey_index, verbs.pkey_index);
  EXPECT_EQ(p.verbs.qps_per_peer, verbs.qps_per_peer);
  EXPECT_TRUE(p.tcp_rails.empty());
  const EngineLimits limits = EngineLimitsFromConfig(Parse(""));
  const EngineLimits engine;
  EXPECT_EQ(limits.max_op_bytes, engine.max_op_bytes);
  EXPECT_EQ(limits.max_ops_per_submit, engine.max_ops_per_submit);
  EXPECT_EQ(limits.default_timeout, engine.default_timeout);
  EXPECT_EQ(limits.max_timeout, engine.max_timeout);
  EXPECT_EQ(limits.slice_bytes, engine.slice_bytes);
  EXPECT_EQ(limits.peer_window_bytes, engine.peer_window_bytes);
  EXPECT_EQ(limits.shutdown_grace, engine.shutdown_grace);  // 30 s
  EXPECT_EQ(limits.per_uid_transfers, engine.per_uid_transfers);
}

TEST(AgentOptionsTest, TcpListensOnThePeerApiHostWhenTcpListenIsEmpty) {
  config::Config c = Parse(kEveryKey);
  c.tcp_listen.clear();
  EXPECT_EQ(ProviderOptionsFromConfig(c, kAmpleFds).tcp.listen_address, "10.1.2.3:0");
  c.peer_listen = "[::1]:7300";
  EXPECT_EQ(ProviderOptionsFromConfig(c, kAmpleFds).tcp.listen_address, "[::1]:0");
  EXPECT_EQ(
      ProviderOptionsFromConfig(Parse("listen: {peer: \"host-b:7100\"}\nsecurity: {mode: insecure, "
                                      "allow_insecure_remote: true}\n"),
                                kAmpleFds)
          .tcp.listen_address,
      "host-b:0");
}

TEST(AgentOptionsTest, TheFdBudgetCapsIncomingConnectionsAndSaysSo) {
  const config::Config c = Parse(kEveryKey);  // tcp_max_connections: 3000
  std::string note;
  EXPECT_EQ(ProviderOptionsFromConfig(c, 500, &note).tcp.max_connections, 500u);
  EXPECT_THAT(note, HasSubstr("tcp: at most 500 incoming connections"));
  EXPECT_THAT(note, HasSubstr("limits.tcp_max_connections 3000"));
  // At or above the configured cap the budget changes nothing, and says nothing.
  EXPECT_EQ(ProviderOptionsFromConfig(c, 3000, &note).tcp.max_connections, 3000u);
  EXPECT_EQ(note, "");
  // The note is optional.
  EXPECT_EQ(ProviderOptionsFromConfig(c, 8).tcp.max_connections, 8u);
}

}  // namespace
}  // namespace ferry::server
