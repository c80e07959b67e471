#include "server/agent/agent_core.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "base/open_files.h"
#include "base/run_ids.h"
#include "base/status_macros.h"
#include "server/agent/agent_options.h"
#include "server/agent/memlock_check.h"
#include "server/local/buffer_lending.h"
#include "server/peers/stage_client.h"
#include "spdlog/spdlog.h"
#include "transport/providers.h"
#include "transport/topology/discovery.h"
#include "transport/topology/nic_address.h"

namespace ferry::server {
namespace {

uint64_t NewIncarnation() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd() | 1;
}

}  // namespace

AgentCore::AgentCore(config::Config config)
    : config_(std::move(config)), incarnation_(NewIncarnation()) {}

absl::StatusOr<std::unique_ptr<AgentCore>> AgentCore::Create(const config::Config& config) {
  std::unique_ptr<AgentCore> core(new AgentCore(config));
  // First: a certificate that cannot be read stops the agent before it takes any memory.
  ASSIGN_OR_RETURN(std::shared_ptr<const PeerCredentials> credentials,
                   PeerCredentials::FromConfig(config.security));
  if (!credentials->tls()) {
    spdlog::warn("security: the Peer API is plaintext and unauthenticated ({}{}): anyone who "
                 "reaches {} can read and write exported buffers; configure security.ca, cert "
                 "and key for mutual TLS",
                 config.security.implicit ? "no security section" : "security.mode: insecure",
                 config.security.allow_insecure_remote ? ", allow_insecure_remote: true" : "",
                 config.peer_listen);
  }
  ASSIGN_OR_RETURN(gid_t admins, LookupGroup(config.security.admin_group, "security.admin_group"));
  core->local_callers_ = std::make_unique<LocalCallers>(admins);
  RETURN_IF_ERROR(core->LoadTopology());
  ASSIGN_OR_RETURN(core->pool_,
                   memory::HostPool::Create(config.host_pool_bytes,
                                            absl::StrCat("ferry-", config.node),
                                            config.host_pool_numa));
  // Connections must never take the agent's last fds (base/open_files.h says why).
  std::string clamped;
  fabric::ProviderOptions providers =
      ProviderOptionsFromConfig(config, ConnectionFdBudget(RaiseOpenFileLimit()), &clamped);
  // One verbs fabric per NIC the plan may choose (nics.allow / deny, ports up); with
  // `tcp.rails: auto` a tcp rail on each of those NICs' interface addresses too.
  const topology::TopologyPlan plan = core->plan();
  for (size_t n = 0; n < plan.nics.size(); ++n) {
    if (!plan.nics[n].selectable) continue;
    const std::string& nic = core->machine_.nics[n].name;
    providers.verbs_devices.push_back(nic);
    if (!config.tcp_rails_auto) continue;
    absl::StatusOr<std::string> address = topology::NicAddress(topology::SysRoot(), nic);
    if (!address.ok()) {
      spdlog::info("tcp rail {} not used: {}", nic, std::string(address.status().message()));
      continue;
    }
    providers.tcp_rails.push_back(
        TcpRailOptions(providers.tcp, nic, absl::StrCat(*address, ":0")));
  }
  if (!clamped.empty()) spdlog::info("{}", clamped);
  std::vector<std::string> skipped;
  ASSIGN_OR_RETURN(core->fabrics_, fabric::CreateFabrics(providers, &skipped));
  for (const auto& why : skipped) spdlog::info("{}", why);
  std::vector<fabric::Fabric*> fabrics;
  for (const auto& f : core->fabrics_) {
    fabrics.push_back(f.get());
    spdlog::info("provider {} listening on {}", f->rail().ToString(), f->address());
  }
  // Said at start, before a registration fails on it (server/agent/memlock_check.h).
  bool verbs_in_use = false;
  for (const auto& f : core->fabrics_) verbs_in_use |= f->provider() == "verbs";
  std::string memlock = MemlockWarning(topology::ProbeMemlock(),
                                       topology::RegisteredHostMemory(plan, config), verbs_in_use);
  if (!memlock.empty()) spdlog::warn("{}", memlock);
  RETURN_IF_ERROR(core->LoadGpus());
  core->rails_ = std::make_unique<FabricRails>(fabrics, core->machine_, plan, core->topology_gpu_,
                                               core->pool_->numa());
  core->bounce_ = std::make_unique<BouncePools>(fabrics, core->gpus_.get());
  const FabricRails* rails = core->rails_.get();
  core->buffers_ = std::make_unique<BufferRegistry>(
      core->pool_.get(), core->gpus_.get(),
      [rails](const BufferMemory& memory) { return rails->For(memory); });
  core->buffers_->StartIdsAt(FirstIdOfRun(core->incarnation_));
  core->client_memory_ = std::make_unique<ClientMemory>(core->buffers_.get(), core->gpus_.get());
  core->sessions_ = std::make_unique<SessionRegistry>(core->buffers_.get(), core->incarnation_,
                                                      core->started_);
  core->peers_ = std::make_unique<PeerDirectory>(config.node, core->incarnation_,
                                                 config.peer_listen, config.peers, fabrics,
                                                 credentials);
  core->leases_ = std::make_unique<ExportLeases>(config.node, core->peers_.get());
  // A verbs device opened again after its removal registers every buffer anew: the keys
  // peers kept are stale (and may name other memory now), so their answers go.
  for (const auto& f : core->fabrics_) {
    f->SetKeysChangedHandler(
        [leases = core->leases_.get()](const std::string& why) { leases->RevokeAll(why); });
  }
  core->buffers_->OnUnexport([leases = core->leases_.get()](const std::vector<std::string>& names) {
    leases->Revoke(names, "freed or unexported");
  });
  core->peer_health_ = std::make_unique<PeerHealth>(core->peers_.get());
  EngineDeps deps;
  deps.buffers = core->buffers_.get();
  deps.peers = core->peers_.get();
  deps.policies = core->policies_.get();
  deps.gpus = core->gpus_.get();
  deps.bounce = core->bounce_.get();
  deps.stage_calls = GrpcStageCalls(core->peers_.get());
  AgentCore* raw = core.get();
  deps.plan = [raw](const Buffer& b, const PolicySnapshot& snap, const fabric::RailId& rail) {
    return raw->PlanLeg(b, snap, rail);
  };
  core->engine_ = std::make_unique<TransferEngine>(std::move(deps),
                                                   EngineLimitsFromConfig(config));
  core->engine_->StartIdsAt(FirstIdOfRun(core->incarnation_));
  // The directory's self entry makes sending to oneself work like sending to any peer.
  core->tensors_ = std::make_unique<TensorState>(core->peers_.get(), core->buffers_.get(),
                                                 core->engine_.get(), config.max_op_bytes,
                                                 config.notifications_per_receiver);
  // The lists, not the tensor state: a session's sweep may still run as that is torn down.
  core->sessions_->OnClose([blocks = core->tensors_->shared_blocks()](uint64_t session) {
    blocks->ReleaseOwnedBy(session);
  });
  core->tensors_->blocks().OnUnexport(
      [leases = core->leases_.get()](const std::vector<std::string>& lists) {
        leases->RevokeLists(lists, "released");
      });
  spdlog::info("node {}: host pool {} MiB ({}), a memfd per buffer", config.node,
               config.host_pool_bytes >> 20, core->pool_->placement());
  return core;
}

void AgentCore::set_fd_inbox(FdInbox* inbox) {
  fd_inbox_ = inbox;
  // The inbox stops before the core goes (main.cc's Stop): `this` outlives the lender.
  inbox->SetLender([this](uint64_t id, const ucred& caller) {
    return LendBufferFile(*local_callers_, *buffers_, id, caller);
  });
  buffers_->LendFilesThrough(inbox->path());
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
  spdlog::info("topology {}: {} GPU(s), {} RDMA NIC(s)",
               config_.topology.empty() ? "of this machine" : config_.topology,
               machine_.gpus.size(), machine_.nics.size());
  // The store builds (and logs) the plan of every policy generation, this first one too.
  ASSIGN_OR_RETURN(policies_, PolicyStore::Create(&machine_, config_.nics, config_.policy));
  return absl::OkStatus();
}

absl::Status AgentCore::LoadGpus() {
  memory::GpuOptions options;
  options.backend = config_.gpu_backend;
  options.count = config_.gpu_sim_count;
  options.sim_copy_bytes_per_sec = config_.gpu_sim_copy_bytes_per_sec;
  // Simulated GPU i sits where the topology's GPU i is.
  for (const auto& gpu : machine_.gpus) options.sim_pci.push_back(gpu.pci);
  std::string why;
  ASSIGN_OR_RETURN(auto devices, memory::CreateGpus(options, &why));
  spdlog::info("{}", why);
  for (const auto& d : devices) {
    int match = -1;
    for (size_t t = 0; t < machine_.gpus.size(); ++t) {
      if (!d->pci().empty() && machine_.gpus[t].pci == d->pci()) match = static_cast<int>(t);
    }
    topology_gpu_.push_back(match);
  }
  ASSIGN_OR_RETURN(gpus_, GpuPools::Create(std::move(devices), config_.gpu_pool_bytes));
  return absl::OkStatus();
}

LegPlan AgentCore::PlanLeg(const Buffer& buffer, const PolicySnapshot& snapshot,
                           const fabric::RailId& rail) const {
  int gpu = buffer.gpu();
  int topology_gpu =
      gpu >= 0 && static_cast<size_t>(gpu) < topology_gpu_.size() ? topology_gpu_[gpu] : -1;
  return server::PlanLeg(buffer, topology_gpu, machine_, snapshot, rail);
}

AgentCore::~AgentCore() {
  // Teardown order, and why:
  // 1. Stop serving peers: their ops in flight here fail UNAVAILABLE (an agent stopping),
  //    not as keys revoked by the buffers freed below.
  // 2. Tensors, then our endpoints: closing them runs the completions of our ops in flight,
  //    which report to the engine, so the engine must still be there.
  // 3. The engine fails what is still running and joins its staging threads, whose Stage
  //    calls use the peers' stubs: the peers go after it.
  // 4. Sessions (joining their sweep, which may be inside a revocation it began before the
  //    hooks below were cleared: the leases and peers it calls go after), then buffers
  //    (revoking their keys; memory back to its pool), bounce pools (their chunks' keys),
  //    GPU pools, the fabrics that made every key, the host pool last.
  // 0. Nobody is told of the buffers freed or lists released below (a session's sweep may
  //    still release lists after the tensors went): peers learn of a restart by our
  //    incarnation.
  if (buffers_) buffers_->OnUnexport(nullptr);
  if (tensors_) tensors_->blocks().OnUnexport(nullptr);
  for (const auto& f : fabrics_) f->StopServing();
  tensors_.reset();
  peer_health_.reset();  // its Health calls use the peers' stubs
  if (peers_) peers_->CloseAll();
  engine_.reset();
  sessions_.reset();
  leases_.reset();
  peers_.reset();
  client_memory_.reset();
  buffers_.reset();
  bounce_.reset();
  gpus_.reset();
  rails_.reset();
  fabrics_.clear();
  pool_.reset();
}

}  // namespace ferry::server
