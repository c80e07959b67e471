#include "server/agent_core.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"
#include "transport/tcp/socket.h"
#include "transport/providers.h"
#include "transport/topology/discovery.h"

namespace ferry::server {
namespace {

uint64_t NewIncarnation() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd() | 1;
}

// The data listener defaults to the peer API's host on any free port; Hello tells peers.
std::string TcpListenAddress(const config::Config& config) {
  if (!config.tcp_listen.empty()) return config.tcp_listen;
  auto hp = tcp::ParseHostPort(config.peer_listen);
  std::string host = hp.ok() ? hp->host : "127.0.0.1";
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  return absl::StrCat(host, ":0");
}

}  // namespace

AgentCore::AgentCore(config::Config config)
    : config_(std::move(config)), incarnation_(NewIncarnation()) {}

absl::StatusOr<std::unique_ptr<AgentCore>> AgentCore::Create(const config::Config& config) {
  std::unique_ptr<AgentCore> core(new AgentCore(config));
  RETURN_IF_ERROR(core->LoadTopology());
  ASSIGN_OR_RETURN(core->pool_, memory::HostPool::Create(config.host_pool_bytes,
                                                         absl::StrCat("ferry-", config.node)));
  fabric::ProviderOptions providers;
  providers.providers = config.providers;
  providers.tcp.listen_address = TcpListenAddress(config);
  providers.tcp.connections = config.tcp_connections;
  providers.verbs.device = config.verbs.device;
  providers.verbs.port = config.verbs.port;
  providers.verbs.gid_index = config.verbs.gid_index;
  providers.verbs.timeout = config.verbs.timeout;
  providers.verbs.retry_cnt = config.verbs.retry_cnt;
  providers.verbs.rnr_retry = config.verbs.rnr_retry;
  providers.verbs.send_queue_depth = config.verbs.send_queue_depth;
  providers.verbs.signal_every = config.verbs.signal_every;
  providers.verbs.inline_threshold = config.verbs.inline_threshold;
  std::vector<std::string> skipped;
  ASSIGN_OR_RETURN(core->fabrics_, fabric::CreateFabrics(providers, &skipped));
  for (const auto& why : skipped) spdlog::info("{}", why);
  std::vector<fabric::Fabric*> fabrics;
  for (const auto& f : core->fabrics_) {
    fabrics.push_back(f.get());
    spdlog::info("provider {} listening on {}", f->provider(), f->address());
  }
  core->buffers_ = std::make_unique<BufferRegistry>(core->pool_.get(), fabrics);
  core->peers_ = std::make_unique<PeerDirectory>(config.node, config.peer_listen, config.peers,
                                                 fabrics);
  EngineLimits limits;
  limits.max_op_bytes = config.max_op_bytes;
  limits.max_ops_per_submit = config.max_ops_per_submit;
  limits.default_timeout = absl::Milliseconds(config.default_timeout_ms);
  core->engine_ = std::make_unique<TransferEngine>(core->buffers_.get(), core->peers_.get(), limits);
  std::map<std::string, std::string> tensor_peers = config.peers;
  tensor_peers[config.node] = config.peer_listen;  // sending to oneself works like any peer
  core->tensors_ = std::make_unique<TensorState>(config.node, std::move(tensor_peers),
                                                 core->buffers_.get(), core->engine_.get(),
                                                 config.max_op_bytes);
  spdlog::info("node {}: host pool {} MiB at {}", config.node, config.host_pool_bytes >> 20,
               core->pool_->path());
  return core;
}

absl::Status AgentCore::LoadTopology() {
  auto machine = topology::DiscoverMachine(config_.topology);
  if (!machine.ok()) {
    // A file the operator named must load; the live machine may simply be unreadable
    // (a container without /sys): then the agent serves host buffers with no GPUs.
    if (!config_.topology.empty()) return machine.status();
    spdlog::warn("topology: cannot read this machine ({}); assuming no GPUs and no NICs",
                 machine.status().ToString());
  } else {
    machine_ = *std::move(machine);
  }
  ASSIGN_OR_RETURN(topology::TopologyPlan plan,
                   topology::BuildPlan(machine_, config_.nics, config_.policy));
  spdlog::info("topology {}: {} GPU(s), {} RDMA NIC(s), provider {}",
               config_.topology.empty() ? "of this machine" : config_.topology,
               machine_.gpus.size(), machine_.nics.size(), plan.provider);
  for (const auto& gpu : plan.gpus) spdlog::info("topology: {}", gpu.reason);
  absl::MutexLock lock(&plan_mu_);
  plan_ = std::move(plan);
  return absl::OkStatus();
}

topology::TopologyPlan AgentCore::plan() const {
  absl::MutexLock lock(&plan_mu_);
  return plan_;
}

AgentCore::~AgentCore() {
  // Endpoints first: closing them runs the completions of ops in flight, which report to the
  // engine, so the engine must still be there.
  tensors_.reset();
  if (peers_) peers_->CloseAll();
  engine_.reset();
  peers_.reset();
  buffers_.reset();
  fabrics_.clear();
  pool_.reset();
}

}  // namespace ferry::server
