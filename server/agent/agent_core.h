#pragma once
// Everything one ferryd owns: host pool, fabrics, GPU and bounce pools, buffers, sessions,
// peers, engine, tensors. The gRPC services are views onto it. Create builds them in that
// order; the destructor tears them down in the one order that is safe, and says why.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "config/config.h"
#include "server/buffers/buffer_registry.h"
#include "server/buffers/client_memory.h"
#include "server/buffers/bounce_pools.h"
#include "server/buffers/fabric_rails.h"
#include "server/engine/leg_planner.h"
#include "server/engine/transfer_engine.h"
#include "server/buffers/gpu_pools.h"
#include "server/agent/drain.h"
#include "server/local/fd_inbox.h"
#include "server/local/local_callers.h"
#include "server/local/sessions.h"
#include "server/policy/policy_store.h"
#include "server/peers/export_leases.h"
#include "server/peers/peer_directory.h"
#include "server/peers/peer_health.h"
#include "server/tensors/tensor_state.h"
#include "transport/fabric.h"
#include "transport/memory/host_pool.h"
#include "transport/topology/machine.h"
#include "transport/topology/plan.h"

namespace ferry::server {

class AgentCore {
 public:
  static absl::StatusOr<std::unique_ptr<AgentCore>> Create(const config::Config& config);
  ~AgentCore();

  const config::Config& config() const { return config_; }
  uint64_t incarnation() const { return incarnation_; }
  // When this run of the agent started (with incarnation: GetInfo, sessions, peers' errors).
  absl::Time started() const { return started_; }
  memory::HostPool& pool() { return *pool_; }
  // In preference order.
  const std::vector<std::unique_ptr<fabric::Fabric>>& fabrics() const { return fabrics_; }
  BufferRegistry& buffers() { return *buffers_; }
  // Clients' own memory, registered as buffers (RegisterMemory).
  ClientMemory& client_memory() { return *client_memory_; }
  // The fd socket (RegisterMemory's descriptors); null until main starts it, and in agents
  // built without a local socket (tests of the core alone).
  FdInbox* fd_inbox() const { return fd_inbox_; }
  // The fd socket: it takes clients' descriptors, and lends each buffer's file to its owner
  // (server/local/buffer_lending.h), which the buffers' mappings name from here on.
  void set_fd_inbox(FdInbox* inbox);
  SessionRegistry& sessions() { return *sessions_; }
  // Who each local connection is (SO_PEERCRED), for the owner checks of the local API.
  LocalCallers& local_callers() { return *local_callers_; }
  PeerDirectory& peers() { return *peers_; }
  // The peers keeping our ResolveBuffer answers, revoked when a name is freed or unexported
  // (the buffer registry's hook), the policy changes or the agent drains.
  ExportLeases& leases() { return *leases_; }
  // Background Health checks of every peer (`ferryctl peers`, metrics).
  const PeerHealth& peer_health() const { return *peer_health_; }
  TransferEngine& engine() { return *engine_; }
  TensorState& tensors() { return *tensors_; }
  // The PCIe topology found at start and the plan made from it under the current policy.
  const topology::Machine& machine() const { return machine_; }
  topology::TopologyPlan plan() const { return policies_->Current()->plan; }
  PolicyStore& policies() { return *policies_; }
  GpuPools* gpus() { return gpus_.get(); }
  BouncePools& bounce() { return *bounce_; }
  // Which fabrics carry which memory (registration and GetInfo's NIC view).
  const FabricRails& rails() const { return *rails_; }
  // What runs first when the agent drains (server/agent/drain.h): discovery deregistration adds
  // its hook here.
  DrainHooks& drain_hooks() { return drain_hooks_; }
  // How this agent moves bytes in or out of `buffer` through `rail` under `snapshot`.
  LegPlan PlanLeg(const Buffer& buffer, const PolicySnapshot& snapshot,
                  const fabric::RailId& rail) const;

 private:
  explicit AgentCore(config::Config config);
  absl::Status LoadTopology();
  absl::Status LoadGpus();

  const config::Config config_;
  const uint64_t incarnation_;
  const absl::Time started_ = absl::Now();
  DrainHooks drain_hooks_;
  topology::Machine machine_;
  std::unique_ptr<PolicyStore> policies_;
  // The GPU index in machine_.gpus for each of our GPUs (matched by PCI address), or -1.
  std::vector<int> topology_gpu_;
  // Built in this order; torn down explicitly by ~AgentCore, which says in what order and why.
  std::unique_ptr<memory::HostPool> pool_;
  std::vector<std::unique_ptr<fabric::Fabric>> fabrics_;
  std::unique_ptr<GpuPools> gpus_;
  std::unique_ptr<FabricRails> rails_;
  std::unique_ptr<BouncePools> bounce_;
  std::unique_ptr<BufferRegistry> buffers_;
  std::unique_ptr<ClientMemory> client_memory_;
  FdInbox* fd_inbox_ = nullptr;
  std::unique_ptr<SessionRegistry> sessions_;
  std::unique_ptr<LocalCallers> local_callers_;
  std::unique_ptr<PeerDirectory> peers_;
  std::unique_ptr<ExportLeases> leases_;
  std::unique_ptr<PeerHealth> peer_health_;
  std::unique_ptr<TransferEngine> engine_;
  // Send/Recv matching and notifications (uses the engine, buffers and peers).
  std::unique_ptr<TensorState> tensors_;
};

}  // namespace ferry::server
