#include "server/buffers/bounce_pools.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

const fabric::MemoryRegion* ChunkLease::region(const fabric::RailId& rail) const {
  return pool_ == nullptr ? nullptr : pool_->region(lease_.chunk(), rail);
}

ChunkLease StagingPool::Acquire(absl::Time deadline) {
  memory::BouncePool::Lease lease = pool_->Acquire(deadline);
  if (!lease) return ChunkLease();
  return ChunkLease(shared_from_this(), std::move(lease));
}

const fabric::MemoryRegion* StagingPool::region(uint32_t chunk, const fabric::RailId& rail) const {
  auto it = regions_.find({chunk, rail});
  return it == regions_.end() ? nullptr : it->second.get();
}

void StagingPool::AddRegion(uint32_t chunk, fabric::RailId rail,
                            std::unique_ptr<fabric::MemoryRegion> r) {
  regions_[{chunk, std::move(rail)}] = std::move(r);
}

absl::StatusOr<std::shared_ptr<StagingPool>> BouncePools::Get(int numa,
                                                             const PolicySnapshot& snapshot) {
  const uint64_t chunk = snapshot.policy.staging_chunk_bytes;
  const uint32_t depth = snapshot.policy.staging_depth;
  absl::MutexLock lock(&mu_);
  auto key = std::make_tuple(numa, chunk, depth);
  auto it = pools_.find(key);
  if (it != pools_.end()) return it->second;
  // Pools of older policies that nobody uses any more go now.
  for (auto p = pools_.begin(); p != pools_.end();) {
    bool same_numa = std::get<0>(p->first) == numa;
    if (same_numa && p->second.use_count() == 1 && p->second->pool().in_use() == 0) {
      p = pools_.erase(p);
    } else {
      ++p;
    }
  }
  std::vector<memory::GpuDevice*> pin;
  for (size_t g = 0; gpus_ != nullptr && g < gpus_->count(); ++g) {
    pin.push_back(&gpus_->device(static_cast<int>(g)));
  }
  std::string name = numa >= 0 ? absl::StrCat("numa", numa) : "any";
  ASSIGN_OR_RETURN(auto bounce, memory::BouncePool::Create(name, numa, chunk, depth * kLegs, pin));
  auto staging = std::make_shared<StagingPool>(std::move(bounce), snapshot.generation);
  for (uint32_t c = 0; c < staging->pool().chunks(); ++c) {
    for (fabric::Fabric* f : fabrics_) {
      ASSIGN_OR_RETURN(auto region, f->Register(staging->pool().chunk_data(c), chunk,
                                                fabric::kRemoteWrite | fabric::kRemoteRead));
      staging->AddRegion(c, f->rail(), std::move(region));
    }
  }
  spdlog::info("bounce pool {}: {} chunks of {} bytes, {}", name, staging->pool().chunks(), chunk,
               staging->pool().placement());
  pools_[key] = staging;
  return staging;
}

std::vector<BouncePoolStats> BouncePools::Stats() const {
  std::vector<BouncePoolStats> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, p] : pools_) {
    const memory::BouncePool& pool = p->pool();
    out.push_back({pool.name(), pool.numa(), pool.chunk_bytes(), pool.chunks(), pool.in_use(),
                   pool.peak_in_use(), pool.placement(), p->generation()});
  }
  return out;
}

}  // namespace ferry::server
