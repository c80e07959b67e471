#pragma once
// ferryd's configuration: YAML -> a validated Config. Every key has a default, so an empty
// (or absent) file gives a working agent. Errors carry file, line and key.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "config/policy.h"

namespace ferry::config {

struct NicFilter {
  // When non-empty only these NICs (by name, e.g. "mlx5_0") may be chosen.
  std::vector<std::string> allow;
  // These NICs are never chosen.
  std::vector<std::string> deny;
};

// The verbs provider (rdma-core). Defaults suit one RC connection per peer on a current HCA.
struct VerbsSettings {
  std::string device;             // "" = every RDMA device (one fabric each), else only this
  uint32_t port = 0;              // 0 = the device's first active port
  int gid_index = -1;             // RoCE GID table index; -1 = pick a RoCE v2 entry
  uint32_t timeout = 14;          // ack timeout exponent: 4.096 us * 2^timeout
  uint32_t retry_cnt = 6;         // transport retries (0..7; 7 = forever on Soft-RoCE)
  uint32_t rnr_retry = 7;         // receiver-not-ready retries (0..7; 7 = forever)
  uint32_t send_queue_depth = 1024;
  uint32_t signal_every = 64;     // completion every Nth WR
  uint32_t inline_threshold = 64; // bytes copied into the WR instead of DMA-read
  uint32_t recv_queue_depth = 256;  // receives per accepted connection that takes immediates
  uint32_t cq_depth = 65536;      // entries per CQ; a device opens more CQs as QPs need room
  uint64_t max_message_bytes = 0; // largest WR, larger ops are split; 0 = port's max_msg_sz
  uint32_t traffic_class = 0;     // GRH traffic class (RoCE: DSCP << 2 | ECN), 0..255
  uint32_t sl = 0;                // InfiniBand service level, 0..15
  uint32_t pkey_index = 0;        // partition key table index, 0..65535
  uint32_t qps_per_peer = 2;      // RC QPs per peer per NIC; slices are spread over them
};

// Discovery through etcd (`discovery`): the agent registers itself under prefix + node with
// a lease it keeps alive, and watches the prefix for its peers. Off when `etcd` is empty.
struct DiscoverySettings {
  std::vector<std::string> etcd;        // client endpoints, "host:port" (http:// optional)
  std::string prefix = "/ferry/nodes/";  // keys are prefix + node name
  absl::Duration lease_ttl = absl::Seconds(10);  // a dead agent's key goes after this
  // The peer address others dial, registered in etcd; "" = listen.peer (with the port the
  // agent bound). Needed when listen.peer is a wildcard (0.0.0.0, [::]).
  std::string advertise;
  bool enabled() const { return !etcd.empty(); }
};

// Who may talk to the Peer API (`security`). mtls: every peer presents a certificate that
// chains to `ca` and names its node (a DNS subjectAltName), and the agent presents `cert`
// for its own node; the sender of every peer message is the name in its certificate.
// insecure: plaintext, nobody authenticated, and only on loopback (listen.peer and every
// peer address) unless allow_insecure_remote.
struct SecuritySettings {
  std::string mode = "mtls";  // "mtls" or "insecure"
  std::string ca;    // PEM file: the CA that signs the cluster's node certificates
  std::string cert;  // PEM file: this node's certificate (chain)
  std::string key;   // PEM file: its private key
  bool allow_insecure_remote = false;
  // Local API: members of this group (like root) may free and use every uid's buffers and
  // sessions; "" = root only.
  std::string admin_group;
  // True when the file had no `security` section: with no certificates to use, the agent
  // runs as `insecure` on loopback (no config at all must give a working agent); a
  // section that names peers or listens beyond loopback must say which mode it wants.
  bool implicit = true;
  bool tls() const { return !implicit && mode == "mtls"; }
};

struct Config {
  // This agent's name among its peers; defaults to the host name.
  std::string node;
  // Local API: Unix domain socket (mode 0660); the TCP listener is opt-in.
  std::string local_socket;      // default /tmp/ferryd-<node>.sock
  std::string local_tcp;         // "" = off, else "host:port"
  uint32_t local_socket_mode = 0660;  // listen.local_mode: who may connect at all
  std::string local_socket_group;     // listen.local_group ("" = the agent's own group)
  // Peer API (gRPC between agents).
  std::string peer_listen = "127.0.0.1:7100";
  // Other agents: node name -> peer API address.
  std::map<std::string, std::string> peers;
  // More found through etcd, when configured.
  DiscoverySettings discovery;
  // Host pool: shared memory carved into client buffers.
  uint64_t host_pool_bytes = 1ull << 30;
  // NUMA node the host pool's pages are bound to (host_pool.numa); -1 = not bound. Host
  // buffers are registered with, and carried by, the NICs of this node (all when -1).
  int host_pool_numa = -1;
  // Fabric providers in order of preference; per peer the first both ends offer is used.
  // One that cannot run here (no RDMA device) is skipped with the reason logged.
  std::vector<std::string> providers = {"verbs", "tcp"};
  // tcp provider.
  uint32_t tcp_connections = 4;
  std::string tcp_listen;        // "" = the peer_listen host, any free port
  // tcp rails: NIC name -> the address ("host" or "host:port") its tcp traffic uses; one
  // tcp fabric per entry instead of the one on tcp_listen.
  std::map<std::string, std::string> tcp_rails;
  // `tcp.rails: auto`: a rail per selectable NIC, on its network interface's address.
  bool tcp_rails_auto = false;
  VerbsSettings verbs;
  // Request limits.
  uint64_t max_op_bytes = 1ull << 30;
  uint32_t max_ops_per_submit = 65536;
  uint32_t default_timeout_ms = 60000;
  uint32_t max_timeout_ms = 600000;    // a Submit may not ask for more
  // SIGTERM drains: new transfers are refused, running ones get this long to finish, the
  // rest are cancelled (server/agent/drain.h). 0: cancel them at once.
  uint32_t shutdown_grace_ms = 30000;
  // Direct ops are cut into slices; at most peer_window_bytes of them are on the wire to
  // one peer at once (four while one transfer has had the peer to itself for 50 ms), and
  // concurrent transfers take turns slice by slice (server/engine/fair_queue.h).
  uint64_t slice_bytes = 1 << 20;
  uint64_t peer_window_bytes = 16 << 20;
  // tcp data listener: incoming connections at most, in total and from one peer node (from
  // one address before their hellos), and how long one may take to send its first frame
  // before it is closed.
  uint32_t tcp_max_connections = 1024;
  uint32_t tcp_max_connections_per_peer = 64;
  uint32_t tcp_handshake_timeout_ms = 5000;
  // What one local uid may hold at once (0: no limit); every refusal names the key and the
  // use (docs/operator-guide.md "Limits per client").
  uint32_t per_uid_transfers = 4096;      // transfers running
  uint32_t per_uid_registrations = 4096;  // RegisterMemory registrations (each holds an fd)
  uint32_t per_uid_buffers = 4096;        // AllocBuffer buffers
  uint32_t notifications_per_receiver = 65536;  // untaken, per uid and sending node
  // Logging: trace, debug, info, warn, error; "text" or "json" lines.
  std::string log_level = "info";
  std::string log_format = "text";
  SecuritySettings security;
  // Prometheus /metrics listener, "host:port"; "" = off.
  std::string metrics_listen;
  // Topology: "" = the live machine, else an `lstopo --of xml` file.
  std::string topology;
  NicFilter nics;
  Policy policy;
  // GPUs: "auto" (CUDA GPUs if any), "cuda", "sim" (simulated: tests and CI), "none".
  std::string gpu_backend = "auto";
  uint32_t gpu_sim_count = 0;          // gpu.count, for sim
  uint64_t gpu_pool_bytes = 1ull << 30;  // device pool slab per GPU
  uint64_t gpu_sim_copy_bytes_per_sec = 0;  // 0: as fast as memcpy

  // Where the file came from ("" when built from defaults); used in messages and SIGHUP.
  std::string source_path;
};

// Parses YAML text. `origin` names the text in error messages (usually the file path).
absl::StatusOr<Config> ParseConfig(absl::string_view yaml, absl::string_view origin);

// Reads and parses a file.
absl::StatusOr<Config> LoadConfigFile(const std::string& path);

// Fills defaults that depend on the machine (node name, socket path) and makes a relative
// socket path absolute (against the current directory).
void ResolveDefaults(Config& config);

// INVALID_ARGUMENT unless `node` can name a node: non-empty, without ':', '/' or spaces.
absl::Status ValidateNodeName(const std::string& node);

// INVALID_ARGUMENT unless `address` is host:port with a numeric port (1..65535 when
// `allow_port_0` is false).
absl::Status ValidateAddress(const std::string& address, bool allow_port_0 = true);

// Insecure mode (explicit, or implied by a file without a `security` section) keeps the
// Peer API on loopback: INVALID_ARGUMENT naming the key when listen.peer, a peer or etcd
// discovery would take plaintext beyond it, unless security.allow_insecure_remote. Peers
// added at run time are held to the same rule when dialled (server/peers/peer_credentials.h).
absl::Status CheckSecurityReach(const Config& config);

// True for a loopback host:port ("127.0.0.1:7100", "localhost:1", "[::1]:2").
bool IsLoopbackAddress(const std::string& address);

// INVALID_ARGUMENT unless `level` is trace, debug, info, warn or error.
absl::Status ValidateLogLevel(const std::string& level);

// Parses only the `policy` section of a config file (for SIGHUP reloads and `ferryctl topo
// --config`); absent section = default policy.
absl::StatusOr<Policy> LoadPolicyFromFile(const std::string& path);

}  // namespace ferry::config
