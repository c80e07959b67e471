#pragma once
// The agent's bounce pools: pinned host memory per NUMA node (the NIC's), sized by the
// policy (chunk size x depth, for a few staged legs at once), each chunk registered with
// every fabric so a peer can WRITE into a chunk it was granted and nowhere else. A policy
// change makes new pools; old ones live until the transfers using them finish.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/agent.pb.h"
#include "server/gpu_pools.h"
#include "server/policy_store.h"
#include "transport/fabric.h"
#include "transport/memory/bounce_pool.h"

namespace ferry::server {

class StagingPool {
 public:
  StagingPool(std::unique_ptr<memory::BouncePool> pool, uint64_t generation)
      : pool_(std::move(pool)), generation_(generation) {}
  // Regions before the pool they point into, so they are revoked first.
  ~StagingPool() { regions_.clear(); }

  memory::BouncePool& pool() { return *pool_; }
  uint64_t generation() const { return generation_; }
  const fabric::MemoryRegion* region(uint32_t chunk, const std::string& provider) const;
  void AddRegion(uint32_t chunk, std::string provider, std::unique_ptr<fabric::MemoryRegion> r);

 private:
  std::unique_ptr<memory::BouncePool> pool_;
  const uint64_t generation_;
  std::map<std::pair<uint32_t, std::string>, std::unique_ptr<fabric::MemoryRegion>> regions_;
};

class BouncePools {
 public:
  // Chunks per pool = depth x kLegs: room for this many staged legs at full depth.
  static constexpr uint32_t kLegs = 4;

  BouncePools(std::vector<fabric::Fabric*> fabrics, GpuPools* gpus)
      : fabrics_(std::move(fabrics)), gpus_(gpus) {}

  // The pool for NUMA node `numa` under `snapshot`'s chunk size and depth.
  absl::StatusOr<std::shared_ptr<StagingPool>> Get(int numa, const PolicySnapshot& snapshot);

  void Fill(ferry::v1::GetInfoResponse* info) const;

 private:
  const std::vector<fabric::Fabric*> fabrics_;
  GpuPools* const gpus_;
  mutable absl::Mutex mu_;
  // (numa, chunk bytes, depth) -> pool
  std::map<std::tuple<int, uint64_t, uint32_t>, std::shared_ptr<StagingPool>> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
