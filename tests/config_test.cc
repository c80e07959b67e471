#include "config/config.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::config {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::string& yaml) {
  auto c = ParseConfig(yaml, "test.yaml");
  EXPECT_FALSE(c.ok()) << yaml;
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(ConfigTest, EmptyFileGivesWorkingDefaults) {
  auto c = ParseConfig("", "empty.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ResolveDefaults(*c);
  EXPECT_FALSE(c->node.empty());
  EXPECT_EQ(c->local_socket, "/tmp/ferryd-" + c->node + ".sock");
  EXPECT_EQ(c->peer_listen, "127.0.0.1:7100");
  EXPECT_EQ(c->tcp_connections, 4u);
  EXPECT_EQ(c->host_pool_bytes, 1ull << 30);
  EXPECT_EQ(c->shutdown_grace_ms, 30000u);
  EXPECT_TRUE(c->peers.empty());
  EXPECT_EQ(c->policy, Policy{});
}

TEST(ConfigTest, FullFileIsRead) {
  auto c = ParseConfig(R"(
node: node-b
listen: {local: /run/f.sock, local_tcp: "127.0.0.1:9000", peer: "0.0.0.0:7101"}
peers: {node-a: "10.0.0.1:7100", node-c: "[::1]:7100"}
host_pool: {size: 2GiB}
tcp: {connections: 8, listen: "0.0.0.0:7200"}
limits: {max_op_bytes: 16MiB, max_ops_per_submit: 100, default_timeout_ms: 5000,
         shutdown_grace_ms: 1500}
log: {level: debug}
topology: /etc/ferry/topo.xml
nics: {allow: [mlx5_0, mlx5_1], deny: [mlx5_2]}
policy: {gdr: always, gdr_max_path: pxb, fallback: fail, staging_chunk: 1MiB, staging_depth: 8}
security: {mode: mtls, ca: /etc/ferry/ca.pem, cert: /etc/ferry/b.pem, key: /etc/ferry/b.key}
)", "full.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node, "node-b");
  EXPECT_EQ(c->local_socket, "/run/f.sock");
  EXPECT_EQ(c->local_tcp, "127.0.0.1:9000");
  EXPECT_EQ(c->peers.at("node-c"), "[::1]:7100");
  EXPECT_EQ(c->host_pool_bytes, 2ull << 30);
  EXPECT_EQ(c->tcp_connections, 8u);
  EXPECT_EQ(c->max_op_bytes, 16ull << 20);
  EXPECT_EQ(c->max_ops_per_submit, 100u);
  EXPECT_EQ(c->default_timeout_ms, 5000u);
  EXPECT_EQ(c->shutdown_grace_ms, 1500u);
  EXPECT_EQ(c->nics.allow, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(c->policy.gdr, GdrMode::kAlways);
  EXPECT_EQ(c->policy.gdr_max_path, PathClass::kPxb);
  EXPECT_EQ(c->policy.fallback, Fallback::kFail);
  EXPECT_EQ(c->policy.staging_chunk_bytes, 1ull << 20);
  EXPECT_EQ(c->policy.staging_depth, 8u);
  EXPECT_TRUE(c->security.tls());
  EXPECT_EQ(c->security.ca, "/etc/ferry/ca.pem");
}

TEST(ConfigTest, VerbsSectionIsParsedAndChecked) {
  auto c = ParseConfig(R"(
verbs: {device: mlx5_1, port: 2, gid_index: 3, timeout: 18, retry_cnt: 5, rnr_retry: 5,
        send_queue_depth: 256, signal_every: 32, inline_threshold: 0, recv_queue_depth: 128,
        cq_depth: 4096, max_message_bytes: 64KiB}
)", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->verbs.device, "mlx5_1");
  EXPECT_EQ(c->verbs.port, 2u);
  EXPECT_EQ(c->verbs.gid_index, 3);
  EXPECT_EQ(c->verbs.timeout, 18u);
  EXPECT_EQ(c->verbs.retry_cnt, 5u);
  EXPECT_EQ(c->verbs.rnr_retry, 5u);
  EXPECT_EQ(c->verbs.send_queue_depth, 256u);
  EXPECT_EQ(c->verbs.signal_every, 32u);
  EXPECT_EQ(c->verbs.inline_threshold, 0u);
  EXPECT_EQ(c->verbs.recv_queue_depth, 128u);
  EXPECT_EQ(c->verbs.cq_depth, 4096u);
  EXPECT_EQ(c->verbs.max_message_bytes, 64u << 10);
  auto d = ParseConfig("", "empty.yaml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->verbs.device, "");
  EXPECT_EQ(d->verbs.gid_index, -1);
  EXPECT_EQ(d->verbs.recv_queue_depth, 256u);
  EXPECT_EQ(d->verbs.cq_depth, 65536u);
  EXPECT_EQ(d->verbs.max_message_bytes, 0u);

  EXPECT_THAT(ErrorOf("verbs:\n  gid: 3\n"),
              HasSubstr("test.yaml:2: key 'verbs.gid': unknown key"));
  EXPECT_THAT(ErrorOf("verbs:\n  gid_index: -2\n"),
              HasSubstr("test.yaml:2: key 'verbs.gid_index': -2 is outside -1..255"));
  EXPECT_THAT(ErrorOf("verbs:\n  retry_cnt: 8\n"),
              HasSubstr("key 'verbs.retry_cnt': 8 is outside 0..7"));
  EXPECT_THAT(ErrorOf("verbs:\n  timeout: x\n"),
              HasSubstr("key 'verbs.timeout': expected a whole number"));
  EXPECT_THAT(ErrorOf("verbs: {send_queue_depth: 16, signal_every: 64}\n"),
              HasSubstr("key 'verbs.signal_every': 64 exceeds send_queue_depth 16"));
  EXPECT_THAT(ErrorOf("verbs:\n  recv_queue_depth: 0\n"),
              HasSubstr("test.yaml:2: key 'verbs.recv_queue_depth': 0 is outside 1..65536"));
  EXPECT_THAT(ErrorOf("verbs:\n  cq_depth: 8388608\n"),
              HasSubstr("test.yaml:2: key 'verbs.cq_depth': 8388608 is outside 1..4194304"));
  EXPECT_THAT(ErrorOf("verbs: {send_queue_depth: 1024, recv_queue_depth: 256, cq_depth: 1023}\n"),
              HasSubstr("key 'verbs.cq_depth': 1023 is less than max(send_queue_depth, "
                        "recv_queue_depth) (1024)"));
  EXPECT_TRUE(ParseConfig("verbs: {cq_depth: 1024}\n", "test.yaml").ok());
  // Without cq_depth the default stands unchecked, as before the key existed.
  EXPECT_TRUE(ParseConfig("verbs: {send_queue_depth: 65536}\n", "test.yaml").ok());
  EXPECT_THAT(ErrorOf("verbs:\n  max_message_bytes: 4\n"),
              HasSubstr("test.yaml:2: key 'verbs.max_message_bytes': must be 0 (the port's "
                        "max_msg_sz) or at least 4KiB"));
  EXPECT_THAT(ErrorOf("verbs:\n  max_message_bytes: lots\n"),
              HasSubstr("key 'verbs.max_message_bytes'"));
  // QoS and partition keys are bounded by what the headers carry.
  EXPECT_THAT(ErrorOf("verbs:\n  sl: 16\n"), HasSubstr("test.yaml:2: key 'verbs.sl'"));
  EXPECT_THAT(ErrorOf("verbs:\n  traffic_class: 256\n"), HasSubstr("key 'verbs.traffic_class'"));
  EXPECT_THAT(ErrorOf("verbs:\n  pkey_index: 65536\n"), HasSubstr("key 'verbs.pkey_index'"));
  auto qos = ParseConfig("verbs: {sl: 15, traffic_class: 255, pkey_index: 7}\n", "test.yaml");
  ASSERT_TRUE(qos.ok()) << qos.status();
  EXPECT_EQ(qos->verbs.sl, 15u);
  EXPECT_EQ(qos->verbs.traffic_class, 255u);
  EXPECT_EQ(qos->verbs.pkey_index, 7u);
}

TEST(ConfigTest, RailsAndTheirMemoryAreParsedAndChecked) {
  auto c = ParseConfig(
      "tcp:\n  rails:\n    mlx5_0: 10.0.0.1\n    mlx5_1: 10.0.1.1:7500\n"
      "host_pool:\n  numa: 1\nverbs:\n  qps_per_peer: 4\n",
      "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tcp_rails.size(), 2u);
  EXPECT_EQ(c->tcp_rails.at("mlx5_0"), "10.0.0.1:0");  // a bare host: any free port
  EXPECT_EQ(c->tcp_rails.at("mlx5_1"), "10.0.1.1:7500");
  EXPECT_EQ(c->host_pool_numa, 1);
  EXPECT_EQ(c->verbs.qps_per_peer, 4u);
  auto d = ParseConfig("", "test.yaml");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->tcp_rails.empty());
  EXPECT_EQ(d->host_pool_numa, -1);
  EXPECT_EQ(d->verbs.qps_per_peer, 2u);

  EXPECT_THAT(ErrorOf("tcp:\n  rails: [10.0.0.1]\n"),
              HasSubstr("test.yaml:2: key 'tcp.rails': expected auto or nic: address pairs"));
  EXPECT_THAT(ErrorOf("tcp:\n  rails: some\n"), HasSubstr("key 'tcp.rails'"));
  auto derived = ParseConfig("tcp:\n  rails: auto\n", "test.yaml");
  ASSERT_TRUE(derived.ok()) << derived.status();
  EXPECT_TRUE(derived->tcp_rails_auto);
  EXPECT_TRUE(derived->tcp_rails.empty());
  EXPECT_THAT(ErrorOf("tcp:\n  rails:\n    mlx5_0: 10.0.0.1:port\n"),
              HasSubstr("test.yaml:3: key 'tcp.rails.mlx5_0'"));
  EXPECT_THAT(ErrorOf("host_pool:\n  numa: -1\n"), HasSubstr("key 'host_pool.numa'"));
  EXPECT_THAT(ErrorOf("verbs:\n  qps_per_peer: 0\n"),
              HasSubstr("key 'verbs.qps_per_peer': 0 is outside 1..16"));
}

// The example shows the defaults: run as it stands, the agent takes the host's name and the
// socket clients look for by default, no peers, and no metrics port (which a second agent on
// the host would collide with).
TEST(ConfigTest, ExampleFileDocumentsValidKeys) {
  auto c = LoadConfigFile(FERRY_SOURCE_DIR "/config/ferry.example.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto defaults = ParseConfig("", "empty.yaml");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(c->node, defaults->node);
  EXPECT_EQ(c->local_socket, defaults->local_socket);
  EXPECT_EQ(c->peer_listen, defaults->peer_listen);
  EXPECT_TRUE(c->peers.empty());
  EXPECT_EQ(c->metrics_listen, "");
  // The limits per client it shows are the defaults.
  EXPECT_EQ(c->per_uid_transfers, defaults->per_uid_transfers);
  EXPECT_EQ(c->per_uid_registrations, defaults->per_uid_registrations);
  EXPECT_EQ(c->per_uid_buffers, defaults->per_uid_buffers);
  EXPECT_EQ(c->notifications_per_receiver, defaults->notifications_per_receiver);
}

// The second example runs beside the first on one host: its own node, socket and peer port.
TEST(ConfigTest, NodeBExampleRunsBesideTheFirst) {
  auto a = LoadConfigFile(FERRY_SOURCE_DIR "/config/ferry.example.yaml");
  auto b = LoadConfigFile(FERRY_SOURCE_DIR "/config/ferry.node-b.example.yaml");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->node, "node-b");
  EXPECT_EQ(b->local_socket, "/tmp/ferryd-node-b.sock");
  EXPECT_NE(b->peer_listen, a->peer_listen);
  EXPECT_EQ(b->metrics_listen, "");
}

// The example documents discovery commented out (it is off by default): uncommented, the
// block must parse as documented.
TEST(ConfigTest, ExampleFileDiscoveryBlockIsValid) {
  std::ifstream in(FERRY_SOURCE_DIR "/config/ferry.example.yaml");
  std::string line, block;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == "# discovery:") inside = true;
    if (inside && line.rfind("# ", 0) != 0) break;
    if (inside) block += line.substr(2) + "\n";
  }
  ASSERT_FALSE(block.empty()) << "no '# discovery:' block in the example";
  // Peers from etcd may be anywhere: only with mutual TLS.
  auto c = ParseConfig(block + "security: {ca: /c.pem, cert: /a.pem, key: /a.key}\n",
                       "example discovery");
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << block;
  EXPECT_EQ(c->discovery.etcd, (std::vector<std::string>{"127.0.0.1:2379"}));
  EXPECT_EQ(c->discovery.prefix, "/ferry/nodes/");
  EXPECT_EQ(c->discovery.lease_ttl, absl::Seconds(10));
  EXPECT_EQ(c->discovery.advertise, "10.0.0.1:7100");
}

// The example's security block, uncommented, is what a cluster with peers on other hosts
// needs: it parses with such peers.
TEST(ConfigTest, ExampleFileSecurityBlockIsValid) {
  std::ifstream in(FERRY_SOURCE_DIR "/config/ferry.example.yaml");
  std::string line, block;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == "# security:") inside = true;
    if (inside && line.rfind("#", 0) != 0) break;
    if (inside && line.rfind("#   #", 0) != 0) block += line.substr(2) + "\n";
  }
  ASSERT_FALSE(block.empty()) << "no '# security:' block in the example";
  auto c = ParseConfig(block + "peers:\n  node-b: 10.0.0.2:7100\n", "example security");
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << block;
  EXPECT_TRUE(c->security.tls());
  EXPECT_EQ(c->security.cert, "/etc/ferry/tls/tls.crt");
  EXPECT_EQ(c->security.admin_group, "");
}

TEST(ConfigTest, DiscoveryIsOffByDefaultAndParsed) {
  auto off = ParseConfig("", "empty.yaml");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->discovery.enabled());
  auto c = ParseConfig(
      "discovery:\n  etcd: [\"http://10.0.0.5:2379/\", 10.0.0.6:2379]\n  prefix: /x/\n"
      "  lease_ttl: 2s\nsecurity: {mode: insecure, allow_insecure_remote: true}\n",
      "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->discovery.enabled());
  EXPECT_EQ(c->discovery.etcd, (std::vector<std::string>{"10.0.0.5:2379", "10.0.0.6:2379"}));
  EXPECT_EQ(c->discovery.prefix, "/x/");
  EXPECT_EQ(c->discovery.lease_ttl, absl::Seconds(2));
  EXPECT_EQ(c->discovery.advertise, "");
}

TEST(ConfigTest, DiscoveryMistakesNameTheKey) {
  EXPECT_THAT(ErrorOf("discovery:\n  prefix: /x/\n"),
              HasSubstr("key 'discovery.etcd': missing"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: 127.0.0.1:2379\n"),
              HasSubstr("key 'discovery.etcd': expected a list"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: []\n"),
              HasSubstr("key 'discovery.etcd': must list at least one endpoint"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [etcdhost]\n"),
              HasSubstr("key 'discovery.etcd': 'etcdhost' is not host:port"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [\"https://e:2379\"]\n"),
              HasSubstr("key 'discovery.etcd': 'https://e:2379': TLS"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [e:2379]\n  prefix: /ferry/nodes\n"),
              HasSubstr("test.yaml:3: key 'discovery.prefix': '/ferry/nodes' must end with '/'"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [e:2379]\n  lease_ttl: 1s\n"),
              HasSubstr("key 'discovery.lease_ttl': 1s is outside 2s..1h"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [e:2379]\n  lease_ttl: 2500ms\n"),
              HasSubstr("key 'discovery.lease_ttl': etcd leases count whole seconds"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [e:2379]\n  lease_ttl: soon\n"),
              HasSubstr("key 'discovery.lease_ttl': expected a duration"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [e:2379]\n  ttl: 5s\n"),
              HasSubstr("key 'discovery.ttl': unknown key"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [e:2379]\n  advertise: here\n"),
              HasSubstr("key 'discovery.advertise': 'here' is not host:port"));
  // A wildcard listener is not an address peers can dial.
  EXPECT_THAT(ErrorOf("listen:\n  peer: 0.0.0.0:7100\ndiscovery:\n  etcd: [e:2379]\n"),
              HasSubstr("key 'discovery.advertise': needed: listen.peer (0.0.0.0:7100)"));
  EXPECT_TRUE(ParseConfig("listen:\n  peer: 0.0.0.0:7100\ndiscovery:\n  etcd: [e:2379]\n"
                          "  advertise: 10.0.0.1:7100\nsecurity: {ca: /c, cert: /a, key: /k}\n",
                          "test.yaml")
                  .ok());
}

TEST(ConfigTest, NodeNamesAndAddressesAreCheckedAlike) {
  EXPECT_TRUE(ValidateNodeName("node-a").ok());
  EXPECT_FALSE(ValidateNodeName("").ok());
  EXPECT_FALSE(ValidateNodeName("a:b").ok());
  EXPECT_FALSE(ValidateNodeName("a/b").ok());
  EXPECT_TRUE(ValidateAddress("127.0.0.1:7100").ok());
  EXPECT_TRUE(ValidateAddress("[::1]:7100").ok());
  EXPECT_TRUE(ValidateAddress("h:0").ok());
  EXPECT_FALSE(ValidateAddress("h:0", /*allow_port_0=*/false).ok());
  EXPECT_FALSE(ValidateAddress("h:65536").ok());
  EXPECT_FALSE(ValidateAddress(":7100").ok());
}

TEST(ConfigTest, UnknownKeysAreRefusedWithLineAndKey) {
  EXPECT_THAT(ErrorOf("node: a\ncolour: blue\n"),
              HasSubstr("test.yaml:2: key 'colour': unknown key"));
  EXPECT_THAT(ErrorOf("tcp:\n  conections: 4\n"), HasSubstr("test.yaml:2: key 'tcp.conections'"));
  EXPECT_THAT(ErrorOf("policy:\n  gdr_max: PIX\n"), HasSubstr("key 'policy.gdr_max'"));
}

TEST(ConfigTest, RepeatedKeysAreRefused) {
  EXPECT_THAT(ErrorOf("listen:\n  peer: \"a:1\"\nlisten:\n  local: /x\n"),
              HasSubstr("test.yaml:3: key 'listen': appears twice"));
  EXPECT_THAT(ErrorOf("tcp:\n  connections: 2\n  connections: 3\n"),
              HasSubstr("key 'tcp.connections': appears twice"));
}

TEST(ConfigTest, WrongTypesAreRefused) {
  EXPECT_THAT(ErrorOf("tcp: 4\n"), HasSubstr("key 'tcp': expected a mapping"));
  EXPECT_THAT(ErrorOf("tcp:\n  connections: [1, 2]\n"),
              HasSubstr("test.yaml:2: key 'tcp.connections'"));
  EXPECT_THAT(ErrorOf("nics:\n  allow: mlx5_0\n"), HasSubstr("key 'nics.allow': expected a list"));
  EXPECT_THAT(ErrorOf("peers: [a, b]\n"), HasSubstr("key 'peers'"));
  EXPECT_THAT(ErrorOf("node: {a: 1}\n"), HasSubstr("key 'node': expected a string"));
}

TEST(ConfigTest, BadValuesAreRefused) {
  EXPECT_THAT(ErrorOf("tcp:\n  connections: 0\n"),
              HasSubstr("key 'tcp.connections': 0 is outside 1..63"));
  EXPECT_THAT(ErrorOf("host_pool:\n  size: 12 parsecs\n"), HasSubstr("key 'host_pool.size'"));
  EXPECT_THAT(ErrorOf("host_pool:\n  size: 1KiB\n"), HasSubstr("at least 1 MiB"));
  EXPECT_THAT(ErrorOf("listen:\n  peer: nowhere\n"),
              HasSubstr("key 'listen.peer': 'nowhere' is not host:port"));
  EXPECT_THAT(ErrorOf("peers:\n  b: \"host:99999\"\n"), HasSubstr("key 'peers.b'"));
  EXPECT_THAT(ErrorOf("log:\n  level: loud\n"), HasSubstr("key 'log.level'"));
  EXPECT_THAT(ErrorOf("node: \"a b\"\n"), HasSubstr("key 'node'"));
  EXPECT_THAT(ErrorOf("policy:\n  gdr: sometimes\n"),
              HasSubstr("key 'policy.gdr': unknown gdr mode 'sometimes'"));
  EXPECT_THAT(ErrorOf("policy:\n  gdr_max_path: FAR\n"), HasSubstr("unknown path class 'FAR'"));
  EXPECT_THAT(ErrorOf("policy:\n  fallback: pray\n"), HasSubstr("key 'policy.fallback'"));
  EXPECT_THAT(ErrorOf("policy:\n  staging_depth: 0\n"), HasSubstr("staging_depth"));
  EXPECT_THAT(ErrorOf("limits:\n  max_op_bytes: 0\n"), HasSubstr("key 'limits.max_op_bytes'"));
  EXPECT_THAT(ErrorOf("limits:\n  shutdown_grace_ms: 7200000\n"),
              HasSubstr("test.yaml:2: key 'limits.shutdown_grace_ms': 7200000 is outside "
                        "0..3600000"));
  EXPECT_THAT(ErrorOf("limits:\n  shutdown_grace_ms: 30s\n"),
              HasSubstr("key 'limits.shutdown_grace_ms': expected milliseconds as a whole "
                        "number: write 30000 for 30s"));
  EXPECT_THAT(ErrorOf("limits:\n  shutdown_grace_ms: soon\n"),
              HasSubstr("key 'limits.shutdown_grace_ms': expected a whole number"));
}

TEST(ConfigTest, ShutdownGraceZeroMeansCancelAtOnce) {
  auto c = ParseConfig("limits:\n  shutdown_grace_ms: 0\n", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shutdown_grace_ms, 0u);
}

TEST(ConfigTest, MalformedYamlNamesTheLine) {
  EXPECT_THAT(ErrorOf("node: a\ntcp: {connections: 4\n"), HasSubstr("test.yaml:"));
  EXPECT_THAT(ErrorOf("node: a\ntcp: {connections: 4\n"), HasSubstr("malformed YAML"));
}

TEST(ConfigTest, MissingFileIsNotFound) {
  auto c = LoadConfigFile("/nonexistent/ferry.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/nonexistent/ferry.yaml"));
}

TEST(ConfigTest, WithoutASecuritySectionThePeerApiStaysOnLoopback) {
  auto c = ParseConfig("peers:\n  node-b: 127.0.0.1:7101\n", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->security.implicit);
  EXPECT_FALSE(c->security.tls());
  // Beyond loopback it needs certificates, and says which key took it there.
  std::string remote = ErrorOf("peers:\n  node-b: 10.0.0.2:7100\n");
  EXPECT_THAT(remote, HasSubstr("peers.node-b"));
  EXPECT_THAT(remote, HasSubstr("security.ca, security.cert and security.key"));
  EXPECT_THAT(ErrorOf("listen:\n  peer: 0.0.0.0:7100\n"), HasSubstr("listen.peer"));
  EXPECT_THAT(ErrorOf("discovery:\n  etcd: [127.0.0.1:2379]\n"), HasSubstr("discovery"));
}

TEST(ConfigTest, MutualTlsNeedsItsThreeFiles) {
  auto c = ParseConfig(
      "listen:\n  peer: 0.0.0.0:7100\npeers:\n  node-b: 10.0.0.2:7100\n"
      "security:\n  mode: mtls\n  ca: /etc/ferry/ca.pem\n  cert: /etc/ferry/a.pem\n"
      "  key: /etc/ferry/a.key\n",
      "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->security.tls());
  EXPECT_EQ(c->security.key, "/etc/ferry/a.key");
  EXPECT_THAT(ErrorOf("security:\n  mode: mtls\n  ca: /x\n  cert: /y\n"),
              HasSubstr("security.key"));
  EXPECT_THAT(ErrorOf("security:\n  ca: /x\n"), HasSubstr("security.cert"));
  EXPECT_THAT(ErrorOf("security:\n  mode: tls\n"), HasSubstr("is not mtls or insecure"));
  EXPECT_THAT(ErrorOf("security:\n  mode: insecure\n  allow_insecure_remote: yes\n"),
              HasSubstr("expected true or false"));
}

TEST(ConfigTest, LocalSocketModeAndGroupAreParsedAndChecked) {
  auto defaults = ParseConfig("", "t");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->local_socket_mode, 0660u);
  EXPECT_EQ(defaults->local_socket_group, "");
  auto c = ParseConfig("listen:\n  local_mode: \"0600\"\n  local_group: ferry\n"
                       "security:\n  mode: insecure\n  admin_group: ferry-admin\n",
                       "t");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->local_socket_mode, 0600u);
  EXPECT_EQ(c->local_socket_group, "ferry");
  EXPECT_EQ(c->security.admin_group, "ferry-admin");
  EXPECT_THAT(ErrorOf("listen:\n  local_mode: \"0460\"\n"), HasSubstr("owner rw"));
  EXPECT_THAT(ErrorOf("listen:\n  local_mode: rw\n"), HasSubstr("listen.local_mode"));
  EXPECT_THAT(ErrorOf("listen:\n  local_mode: \"01777\"\n"), HasSubstr("listen.local_mode"));
  // The local API over TCP only with mutual TLS.
  EXPECT_THAT(ErrorOf("listen:\n  local_tcp: 127.0.0.1:9000\n"),
              HasSubstr("key 'listen.local_tcp': the local API over TCP needs mutual TLS"));
}

TEST(ConfigTest, InsecureModeLeavesLoopbackOnlyWhenAllowed) {
  auto local = ParseConfig("security:\n  mode: insecure\npeers:\n  b: localhost:7101\n", "t");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(local->security.tls());
  EXPECT_FALSE(local->security.implicit);
  std::string refused = ErrorOf("security:\n  mode: insecure\npeers:\n  b: 10.0.0.2:7100\n");
  EXPECT_THAT(refused, HasSubstr("peers.b"));
  EXPECT_THAT(refused, HasSubstr("allow_insecure_remote"));
  auto allowed = ParseConfig(
      "security:\n  mode: insecure\n  allow_insecure_remote: true\n"
      "listen:\n  peer: 0.0.0.0:7100\n",
      "t");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  // Flags are checked the same way once applied (server/main.cc).
  Config flagged;
  flagged.peer_listen = "[::1]:7100";
  EXPECT_TRUE(CheckSecurityReach(flagged).ok());
  flagged.peers["c"] = "192.168.1.3:7100";
  EXPECT_THAT(std::string(CheckSecurityReach(flagged).message()), HasSubstr("peers.c"));
}

TEST(PolicyTest, SettingsApplyOrAreRefusedWithTheKey) {
  Policy p;
  ASSERT_TRUE(ApplyPolicySetting("gdr_max_path", "SYS", p).ok());
  EXPECT_EQ(p.gdr_max_path, PathClass::kSys);
  ASSERT_TRUE(ApplyPolicySetting("staging_chunk", "8MiB", p).ok());
  EXPECT_EQ(p.staging_chunk_bytes, 8ull << 20);
  EXPECT_THAT(std::string(ApplyPolicySetting("depth", "4", p).message()),
              HasSubstr("unknown policy key 'depth'"));
  EXPECT_THAT(std::string(ApplyPolicySetting("staging_depth", "four", p).message()),
              HasSubstr("staging_depth"));
  EXPECT_THAT(std::string(ApplyPolicySetting("staging_chunk", "1", p).message()),
              HasSubstr("staging_chunk"));
}

}  // namespace
}  // namespace ferry::config
