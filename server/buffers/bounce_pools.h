#pragma once
// The agent's bounce pools: pinned host memory per NUMA node (the NIC's), sized by the
// policy (chunk size x depth, for a few staged legs at once), each chunk registered with
// every fabric so a peer can WRITE into a chunk it was granted and nowhere else. A policy
// change makes new pools; old ones live until the transfers using them finish.
//
// Chunks are handed out as leases (ChunkLease): whoever holds one holds the chunk, its
// registrations and the pool; dropping it gives the chunk back. No other path returns one.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/policy.h"
#include "server/buffers/gpu_pools.h"
#include "server/policy/policy_store.h"
#include "transport/fabric.h"
#include "transport/memory/bounce_pool.h"

namespace ferry::server {

class StagingPool;

// One bounce chunk, held. Move-only; the chunk goes back to its pool when the lease is
// dropped. Keeps the pool (and the chunk's registrations) alive while it is held.
class ChunkLease {
 public:
  ChunkLease() = default;
  ChunkLease(ChunkLease&&) noexcept = default;
  // The held chunk goes back to its pool before that pool's reference is let go.
  ChunkLease& operator=(ChunkLease&& other) noexcept {
    lease_ = std::move(other.lease_);
    pool_ = std::move(other.pool_);
    return *this;
  }
  ChunkLease(const ChunkLease&) = delete;
  ChunkLease& operator=(const ChunkLease&) = delete;

  explicit operator bool() const { return static_cast<bool>(lease_); }
  char* data() const { return lease_.data(); }
  uint64_t length() const { return lease_.length(); }
  // The chunk's registration with `rail`'s fabric (what a peer WRITEs into or READs from).
  const fabric::MemoryRegion* region(const fabric::RailId& rail) const;

 private:
  friend class StagingPool;
  ChunkLease(std::shared_ptr<StagingPool> pool, memory::BouncePool::Lease lease)
      : pool_(std::move(pool)), lease_(std::move(lease)) {}
  // The pool before the lease: the chunk is returned before the pool may go.
  std::shared_ptr<StagingPool> pool_;
  memory::BouncePool::Lease lease_;
};

class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  StagingPool(std::unique_ptr<memory::BouncePool> pool, uint64_t generation)
      : pool_(std::move(pool)), generation_(generation) {}
  // Regions before the pool they point into, so they are revoked first.
  ~StagingPool() { regions_.clear(); }

  // A free chunk, waiting until `deadline` for one; an empty lease on timeout.
  ChunkLease Acquire(absl::Time deadline);

  const memory::BouncePool& pool() const { return *pool_; }
  uint64_t chunk_bytes() const { return pool_->chunk_bytes(); }
  uint64_t generation() const { return generation_; }
  const fabric::MemoryRegion* region(uint32_t chunk, const fabric::RailId& rail) const;
  void AddRegion(uint32_t chunk, fabric::RailId rail, std::unique_ptr<fabric::MemoryRegion> r);

 private:
  std::unique_ptr<memory::BouncePool> pool_;
  const uint64_t generation_;
  std::map<std::pair<uint32_t, fabric::RailId>, std::unique_ptr<fabric::MemoryRegion>> regions_;
};

// What GetInfo and metrics read of one bounce pool.
struct BouncePoolStats {
  std::string name;
  int numa = -1;
  uint64_t chunk_bytes = 0;
  uint32_t chunks = 0;
  uint32_t chunks_in_use = 0;
  uint32_t peak_chunks_in_use = 0;
  std::string placement;
  uint64_t policy_generation = 0;
};

class BouncePools {
 public:
  // Chunks per pool = depth x kLegs: room for this many staged legs at full depth.
  static constexpr uint32_t kLegs = config::kBounceLegs;

  BouncePools(std::vector<fabric::Fabric*> fabrics, GpuPools* gpus)
      : fabrics_(std::move(fabrics)), gpus_(gpus) {}

  // The pool for NUMA node `numa` under `snapshot`'s chunk size and depth.
  absl::StatusOr<std::shared_ptr<StagingPool>> Get(int numa, const PolicySnapshot& snapshot);

  std::vector<BouncePoolStats> Stats() const;

 private:
  const std::vector<fabric::Fabric*> fabrics_;
  GpuPools* const gpus_;
  mutable absl::Mutex mu_;
  // (numa, chunk bytes, depth) -> pool
  std::map<std::tuple<int, uint64_t, uint32_t>, std::shared_ptr<StagingPool>> pools_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
