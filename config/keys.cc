#include "config/keys.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "config/key_types.h"
#include "yaml-cpp/yaml.h"

namespace ferry::config {

absl::Status Context::Error(const YAML::Node& node, absl::string_view key,
                            absl::string_view what) const {
  if (origin_.empty()) return absl::InvalidArgumentError(absl::StrCat("key '", key, "': ", what));
  int line = node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
  return absl::InvalidArgumentError(absl::StrCat(origin_, ":", line, ": key '", key, "': ", what));
}

namespace {

using namespace key_types;  // the row builders: Text, Whole, Size, ...

constexpr Reload kRestart = Reload::kRestart;
constexpr Reload kSighup = Reload::kSighup;

#define FIELD(path) \
  [](auto& c) -> auto& { return c.path; }

std::vector<Key> MakeKeys() {
  return {
      Text("node", FIELD(node), kRestart,
           "this agent's name among its peers and in its certificate; unset: the host name",
           ValidateNodeName, ""),
      Text("listen.local", FIELD(local_socket), kRestart,
           "the local API's Unix socket; unset: `/tmp/ferryd-<node>.sock`", nullptr, ""),
      SocketMode("listen.local_mode", kRestart, "who may connect to the socket at all (chmod)"),
      Text("listen.local_group", FIELD(local_socket_group), kRestart,
           "the socket's group; \"\" = the agent's own group"),
      Address("listen.local_tcp", FIELD(local_tcp), kRestart,
              "the local API over TCP (needs mutual TLS); \"\" = off", CheckAddressOrOff),
      Address("listen.peer", FIELD(peer_listen), kRestart, "the Peer API (agent to agent)",
              CheckAddress),
      Peers("peers", kSighup, "other agents by node name: their Peer API address"),
      Choice("security.mode", FIELD(security.mode), {"mtls", "insecure"}, kRestart,
             "mtls: peers prove their node by certificate; insecure: plaintext"),
      Text("security.ca", FIELD(security.ca), kRestart,
           "PEM file: the CA that signs the cluster's node certificates"),
      Text("security.cert", FIELD(security.cert), kRestart,
           "PEM file: this node's certificate (chain)"),
      Text("security.key", FIELD(security.key), kRestart, "PEM file: its private key"),
      Flag("security.allow_insecure_remote", FIELD(security.allow_insecure_remote), kRestart,
           "let mode insecure leave loopback (logged loudly)"),
      Text("security.admin_group", FIELD(security.admin_group), kRestart,
           "local clients in this group may use every uid's buffers, as root may"),
      EtcdEndpoints("discovery.etcd", kRestart,
                    "etcd client endpoints; more than one for failover"),
      Text("discovery.prefix", FIELD(discovery.prefix), kRestart,
           "agents register under prefix + node", CheckPrefix),
      LeaseTtl("discovery.lease_ttl", kRestart, "a dead agent's key goes after this"),
      Address("discovery.advertise", FIELD(discovery.advertise), kRestart,
              "the Peer API address others dial; unset: listen.peer", CheckDialable, ""),
      Size("host_pool.size", FIELD(host_pool_bytes), 1 << 20, kRestart,
           "shared memory carved into host buffers; pages committed when used"),
      Whole("host_pool.numa", FIELD(host_pool_numa), 0, 1023, kRestart,
            "NUMA node for the host pool's pages (and its NICs); unset: unbound, every NIC", false,
            -1),
      Providers("providers", kRestart,
                "fabric providers by preference; per peer the first both offer"),
      // 63: a session admits 64 sockets, and one is the express connection (tcp_fabric.h).
      Whole("tcp.connections", FIELD(tcp_connections), 1, 63, kRestart,
            "bulk connections per peer; ops of 64 KiB or less take one more of their own"),
      Address("tcp.listen", FIELD(tcp_listen), kRestart,
              "the tcp data listener; unset: the Peer API's host, any free port", CheckAddress, ""),
      TcpRails("tcp.rails", kRestart,
               "one tcp fabric per NIC on its address; auto: from its netdev"),
      Text("verbs.device", FIELD(verbs.device), kRestart,
           "RDMA device; \"\" = every device, one fabric per NIC"),
      Whole("verbs.port", FIELD(verbs.port), 0, 255, kRestart,
            "0 = each device's first active port"),
      Whole("verbs.gid_index", FIELD(verbs.gid_index), -1, 255, kRestart,
            "RoCE GID table index; -1 = the port's RoCE v2 GID"),
      Whole("verbs.timeout", FIELD(verbs.timeout), 0, 31, kRestart,
            "ack timeout exponent: 4.096 us * 2^timeout"),
      Whole("verbs.retry_cnt", FIELD(verbs.retry_cnt), 0, 7, kRestart,
            "transport retries (7 = forever on Soft-RoCE)"),
      Whole("verbs.rnr_retry", FIELD(verbs.rnr_retry), 0, 7, kRestart,
            "receiver-not-ready retries (7 = forever)"),
      Whole("verbs.send_queue_depth", FIELD(verbs.send_queue_depth), 1, 1 << 16, kRestart,
            "work requests in flight per queue pair"),
      Whole("verbs.signal_every", FIELD(verbs.signal_every), 1, 1 << 16, kRestart,
            "a completion every Nth work request"),
      Whole("verbs.inline_threshold", FIELD(verbs.inline_threshold), 0, 1024, kRestart,
            "payloads up to this many bytes are copied into the work request"),
      Whole("verbs.recv_queue_depth", FIELD(verbs.recv_queue_depth), 1, 1 << 16, kRestart,
            "receives posted per connection that takes immediates"),
      // 2^22 is above any HCA's max_cqe (mlx5: 2^22 - 1), which clamps it anyway.
      Whole("verbs.cq_depth", FIELD(verbs.cq_depth), 1, 1 << 22, kRestart,
            "entries per completion queue; a device opens more CQs as connections need room"),
      // Below a page per work request is a slip of the unit (4 for 4KiB), not a tuning.
      Size("verbs.max_message_bytes", FIELD(verbs.max_message_bytes), 4096, kRestart,
           "largest work request, larger ops are split", "the port's max_msg_sz"),
      // QoS and partition: what the fabric's lossless class and partitions are set up for
      // (a RoCE fabric with PFC/ECN on DSCP 26 wants traffic_class 106, as NCCL_IB_TC).
      Whole("verbs.traffic_class", FIELD(verbs.traffic_class), 0, 255, kRestart,
            "GRH traffic class (RoCE: DSCP << 2 | ECN)"),
      Whole("verbs.sl", FIELD(verbs.sl), 0, 15, kRestart, "InfiniBand service level"),
      Whole("verbs.pkey_index", FIELD(verbs.pkey_index), 0, 65535, kRestart,
            "partition key table index"),
      Whole("verbs.qps_per_peer", FIELD(verbs.qps_per_peer), 1, 16, kRestart,
            "RC queue pairs per peer per NIC; a large op's slices spread over them"),
      Size("limits.max_op_bytes", FIELD(max_op_bytes), 1, kSighup, "largest single op"),
      Whole("limits.max_ops_per_submit", FIELD(max_ops_per_submit), 1, 1 << 20, kSighup,
            "most ops in one Submit"),
      Millis("limits.default_timeout_ms", FIELD(default_timeout_ms), 1, 86400000, kSighup,
             "deadline of a transfer whose Submit gives none"),
      Millis("limits.max_timeout_ms", FIELD(max_timeout_ms), 1, 86400000, kSighup,
             "the longest deadline a Submit may ask for"),
      Size("limits.slice_bytes", FIELD(slice_bytes), 4096, kSighup,
           "direct ops are cut into slices of this size"),
      Size("limits.peer_window_bytes", FIELD(peer_window_bytes), 1, kRestart,
           "slice bytes on the wire to one peer at once"),
      Whole("limits.tcp_max_connections", FIELD(tcp_max_connections), 1, 1 << 20, kRestart,
            "incoming tcp data connections in all"),
      Whole("limits.tcp_max_connections_per_peer", FIELD(tcp_max_connections_per_peer), 1, 1 << 20,
            kRestart, "incoming tcp data connections from one peer node"),
      Millis("limits.tcp_handshake_timeout_ms", FIELD(tcp_handshake_timeout_ms), 1, 600000,
             kRestart, "how long a new tcp connection may take to send its first frame"),
      // An hour at most: systemd's TimeoutStopSec and Kubernetes'
      // terminationGracePeriodSeconds must cover it, or the agent is killed mid-drain.
      Millis("limits.shutdown_grace_ms", FIELD(shutdown_grace_ms), 0, 3600000, kSighup,
             "SIGTERM: how long running transfers get to finish; 0 = cancel at once"),
      Whole("limits.per_uid_transfers", FIELD(per_uid_transfers), 0, 1 << 24, kRestart,
            "transfers one uid has running (0: no limit)"),
      Whole("limits.per_uid_registrations", FIELD(per_uid_registrations), 0, 1 << 24, kRestart,
            "RegisterMemory registrations of one uid (0: no limit)"),
      Whole("limits.per_uid_buffers", FIELD(per_uid_buffers), 0, 1 << 24, kRestart,
            "AllocBuffer buffers of one uid (0: no limit)"),
      Whole("limits.notifications_per_receiver", FIELD(notifications_per_receiver), 1, 1 << 24,
            kRestart, "untaken notifications per uid and sending node; past it the oldest go"),
      Choice("log.level", FIELD(log_level), {"trace", "debug", "info", "warn", "error"}, kSighup,
             "debug: each transfer's plan and outcome"),
      Choice("log.format", FIELD(log_format), {"text", "json"}, kRestart,
             "json: one object per line"),
      Address("metrics.listen", FIELD(metrics_listen), kRestart,
              "Prometheus /metrics listener; \"\" = off", CheckAddressOrOff),
      Text("topology", FIELD(topology), kRestart,
           "PCIe topology: \"\" = this machine, else an `lstopo --of xml` file"),
      Names("nics.allow", FIELD(nics.allow), kRestart, "only these RDMA NICs (empty: all)"),
      Names("nics.deny", FIELD(nics.deny), kRestart, "never these RDMA NICs"),
      PolicyKey("gdr", "auto, always or never", kSighup,
                "GPUDirect RDMA: by path class, always, never",
                [](const Config& c) { return GdrModeName(c.policy.gdr); }),
      PolicyKey("gdr_max_path", "PIX, PXB, PHB, NODE or SYS", kSighup,
                "longest PCIe path GDR may use",
                [](const Config& c) { return PathClassName(c.policy.gdr_max_path); }),
      PolicyKey("fallback", "staged or fail", kSighup, "when GDR is not allowed",
                [](const Config& c) { return FallbackName(c.policy.fallback); }),
      PolicyKey("staging_chunk", "size 4KiB..1GiB", kSighup, "staging pipeline chunk size",
                [](const Config& c) { return SizeText(c.policy.staging_chunk_bytes); }),
      PolicyKey("staging_depth", "whole number 1..256", kSighup, "staging chunks in flight per leg",
                [](const Config& c) { return absl::StrCat(c.policy.staging_depth); }),
      Choice("gpu.backend", FIELD(gpu_backend), {"auto", "cuda", "sim", "none"}, kRestart,
             "auto: CUDA GPUs if any; sim: simulated GPUs for tests and CI"),
      Whole("gpu.count", FIELD(gpu_sim_count), 0, 64, kRestart, "simulated GPUs (backend sim)"),
      Size("gpu.pool_size", FIELD(gpu_pool_bytes), 1 << 20, kRestart,
           "device memory pool per GPU, carved into buffers"),
      Size("gpu.sim_copy_rate", FIELD(gpu_sim_copy_bytes_per_sec), 0, kRestart,
           "sim: copy-engine bytes per second per GPU; 0 = memcpy"),
  };
}

#undef FIELD

std::string SectionOf(absl::string_view key) {
  size_t dot = key.find('.');
  return dot == absl::string_view::npos ? "" : std::string(key.substr(0, dot));
}

}  // namespace

const std::vector<Key>& Keys() {
  static const std::vector<Key>* keys = new std::vector<Key>(MakeKeys());
  return *keys;
}

const std::vector<Section>& Sections() {
  static const std::vector<Section>* sections = new std::vector<Section>{
      {"security", "mutual TLS between agents; absent: plaintext, loopback only",
       [](const Config& c) { return !c.security.implicit; },
       [](Config& c) { c.security.implicit = false; }},
      {"discovery", "more peers found through etcd; absent: off",
       [](const Config& c) { return c.discovery.enabled(); }, [](Config&) {}},
  };
  return *sections;
}

const Key* FindKey(absl::string_view name) {
  for (const Key& key : Keys()) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

const Section* FindSection(absl::string_view name) {
  for (const Section& section : Sections()) {
    if (section.name == name) return &section;
  }
  return nullptr;
}

absl::Status SetKey(Config& config, absl::string_view name, absl::string_view value) {
  const Key* key = FindKey(name);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown key ", Echo(name), " (every key: ferryd --print-config, docs/config-keys.md)"));
  }
  auto read = [&](const YAML::Node& node) -> absl::Status {
    Config next = config;  // a refused value leaves nothing half set
    if (const Section* section = FindSection(SectionOf(name))) section->mark(next);
    try {
      RETURN_IF_ERROR(key->read(Context(""), node, next));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("key '", name, "': ", e.msg));
    }
    config = std::move(next);
    return absl::OkStatus();
  };
  // A command line's value is text: first the one string it is ("[::1]:7100" is an address,
  // not a list); YAML only where that is not what the key takes ("[mlx5_0]", "{b: h:1}").
  absl::Status as_text = read(YAML::Node(std::string(value)));
  if (as_text.ok()) return as_text;
  YAML::Node parsed;
  try {
    parsed = YAML::Load(std::string(value));
  } catch (const YAML::Exception&) {
    return as_text;
  }
  return parsed.IsSequence() || parsed.IsMap() ? read(parsed) : as_text;
}

std::string PrintConfig(const Config& config, absl::string_view origin) {
  std::string out =
      absl::StrCat("# ferryd's effective config (", origin,
                   "). Every key; an unset one, or an absent section, commented out.\n");
  std::string section = "";
  bool skipping = false;  // inside a section the config does not have
  for (const Key& key : Keys()) {
    const std::string s = SectionOf(key.name);
    if (s != section) {
      section = s;
      skipping = false;
      out += "\n";
      if (const Section* sec = FindSection(s); sec != nullptr && !sec->present(config)) {
        absl::StrAppend(&out, "# ", s, ": absent (", sec->doc, ")\n");
        skipping = true;
      } else if (!s.empty()) {
        absl::StrAppend(&out, s, ":\n");
      }
    }
    if (skipping) continue;
    const std::string indent = s.empty() ? "" : "  ";
    const std::string leaf = s.empty() ? key.name : key.name.substr(s.size() + 1);
    std::optional<std::string> value = key.show(config);
    if (value) {
      absl::StrAppend(&out, indent, leaf, ": ", *value, "\n");
    } else {
      absl::StrAppend(&out, indent, "# ", leaf, ": unset (", key.doc, ")\n");
    }
  }
  return out;
}

std::optional<std::pair<std::string, std::string>> BrokenRule(const Config& c) {
  const VerbsSettings& v = c.verbs;
  // Each queue pair reserves its whole queue in one CQ (transport/verbs/cq_pool.h): a CQ
  // smaller than one queue would refuse every peer.
  const uint64_t one_queue = std::max(v.send_queue_depth, v.recv_queue_depth);
  if (v.cq_depth < one_queue) {
    return std::pair{
        "verbs.cq_depth",
        absl::StrCat(v.cq_depth, " is less than max(send_queue_depth, recv_queue_depth) (",
                     one_queue, "): not one connection would fit")};
  }
  if (v.signal_every > v.send_queue_depth) {
    return std::pair{"verbs.signal_every",
                     absl::StrCat(v.signal_every, " exceeds send_queue_depth ", v.send_queue_depth,
                                  ": the send queue would fill before a completion frees it")};
  }
  if (c.gpu_backend != "sim" && c.gpu_sim_count > 0) {
    return std::pair{"gpu.count", std::string("only applies to gpu.backend: sim")};
  }
  for (auto [key, file] : {std::pair{"security.ca", &c.security.ca},
                           {"security.cert", &c.security.cert},
                           {"security.key", &c.security.key}}) {
    if (c.security.tls() && file->empty()) {
      return std::pair{key, std::string("needed for security.mode mtls (a PEM file; or "
                                        "security.mode: insecure)")};
    }
  }
  // A wildcard listener is no address to dial: peers need the one to register.
  const std::string host = c.peer_listen.substr(0, c.peer_listen.rfind(':'));
  if (c.discovery.enabled() && c.discovery.advertise.empty() &&
      (host == "0.0.0.0" || host == "[::]" || host.empty())) {
    return std::pair{"discovery.advertise",
                     absl::StrCat("needed: listen.peer (", c.peer_listen,
                                  ") is on every address; name the host:port peers dial")};
  }
  return std::nullopt;
}

std::vector<std::string> RestartOnlyChanges(const Config& running, const Config& next) {
  std::vector<std::string> changed;
  for (const Section& section : Sections()) {
    if (section.present(running) != section.present(next)) changed.push_back(section.name);
  }
  for (const Key& key : Keys()) {
    if (key.reload == Reload::kRestart && key.show(running) != key.show(next)) {
      changed.push_back(key.name);
    }
  }
  return changed;
}

}  // namespace ferry::config
