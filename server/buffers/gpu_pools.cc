#include "server/buffers/gpu_pools.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

class GpuPools::Block : public BufferMemory {
 public:
  Block(Pool* pool, int gpu, uint64_t offset, uint64_t size)
      : pool_(pool), gpu_(gpu), offset_(offset), size_(size) {}
  ~Block() override {
    absl::MutexLock lock(&pool_->mu);
    absl::Status s = pool_->allocator->Free(offset_);
    if (!s.ok()) spdlog::error("GPU pool {}: {}", gpu_, s.ToString());
  }

  char* data() const override { return static_cast<char*>(pool_->slab->data()) + offset_; }
  uint64_t size() const override { return size_; }
  std::string device() const override { return absl::StrCat("cuda:", gpu_); }
  int gpu() const override { return gpu_; }
  std::string backend() const override { return pool_->device->backend(); }
  absl::StatusOr<BufferMapping> mapping() const override {
    ASSIGN_OR_RETURN(memory::GpuExport exported, pool_->slab->Export(offset_, size_));
    return GpuMapping{std::move(exported), pool_->device->pci()};
  }

 private:
  Pool* pool_;
  int gpu_;
  uint64_t offset_;
  uint64_t size_;
};

// A client's allocation, imported into the agent: the whole slab is the buffer.
class GpuPools::Imported : public BufferMemory {
 public:
  Imported(const Pool* pool, int gpu, std::unique_ptr<memory::DeviceSlab> slab)
      : pool_(pool), gpu_(gpu), slab_(std::move(slab)) {}

  char* data() const override { return static_cast<char*>(slab_->data()); }
  uint64_t size() const override { return slab_->size(); }
  std::string device() const override { return absl::StrCat("cuda:", gpu_); }
  int gpu() const override { return gpu_; }
  std::string backend() const override { return pool_->device->backend(); }
  absl::StatusOr<BufferMapping> mapping() const override {
    ASSIGN_OR_RETURN(memory::GpuExport exported, slab_->Export(0, slab_->size()));
    return GpuMapping{std::move(exported), pool_->device->pci()};
  }
  bool registered() const override { return true; }

 private:
  const Pool* pool_;
  int gpu_;
  std::unique_ptr<memory::DeviceSlab> slab_;
};

absl::StatusOr<std::unique_ptr<GpuPools>> GpuPools::Create(
    std::vector<std::unique_ptr<memory::GpuDevice>> gpus, uint64_t pool_bytes) {
  std::unique_ptr<GpuPools> pools(new GpuPools());
  for (auto& gpu : gpus) {
    auto pool = std::make_unique<Pool>();
    ASSIGN_OR_RETURN(pool->slab, gpu->AllocateSlab(pool_bytes));
    pool->allocator = std::make_unique<memory::RangeAllocator>(pool_bytes, kAlignment);
    pool->device = std::move(gpu);
    pools->pools_.push_back(std::move(pool));
  }
  return pools;
}

GpuPools::~GpuPools() = default;

absl::StatusOr<std::unique_ptr<BufferMemory>> GpuPools::Import(int gpu,
                                                               const memory::GpuImport& what) {
  if (gpu < 0 || static_cast<size_t>(gpu) >= pools_.size()) {
    return absl::NotFoundError(absl::StrCat("device: this agent has no GPU cuda:", gpu, " (it has ",
                                            pools_.size(), ")"));
  }
  const Pool& pool = *pools_[gpu];
  ASSIGN_OR_RETURN(std::unique_ptr<memory::DeviceSlab> slab, pool.device->Import(what));
  return std::unique_ptr<BufferMemory>(new Imported(&pool, gpu, std::move(slab)));
}

absl::StatusOr<std::unique_ptr<BufferMemory>> GpuPools::Allocate(int gpu, uint64_t size) {
  if (gpu < 0 || static_cast<size_t>(gpu) >= pools_.size()) {
    return absl::NotFoundError(absl::StrCat("device: this agent has no GPU cuda:", gpu, " (it has ",
                                            pools_.size(), ")"));
  }
  Pool& pool = *pools_[gpu];
  absl::MutexLock lock(&pool.mu);
  auto offset = pool.allocator->Allocate(size);
  if (!offset.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("GPU cuda:", gpu, " pool: ", offset.status().message()));
  }
  return std::unique_ptr<BufferMemory>(new Block(&pool, gpu, *offset, size));
}

GdrRegistration GpuPools::RegisterForGdr(int gpu, fabric::Fabric& fabric, char* data,
                                         uint64_t length, uint32_t access) {
  Pool& pool = *pools_[gpu];
  const fabric::RailId rail = fabric.rail();
  GdrRegistration out;
  out.attempt.rail = rail;
  {
    absl::MutexLock lock(&pool.mu);
    auto it = pool.registrations.find(rail);
    if (it != pool.registrations.end() && !it->second.last.status.ok() &&
        absl::Now() < it->second.retry_after) {
      out.attempt = it->second.last;
      return out;
    }
  }
  absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> region;
  std::string why;
  if (pool.device->host_addressable()) {
    // Device memory the CPU can address (a cache-coherent GPU; neither backend here): every
    // provider can register it as host memory.
    region = fabric.Register(data, length, access);
    out.attempt.method = absl::StrCat(pool.device->backend(), " GPU memory is host memory");
  } else {
    // Device memory (CUDA's, and the simulation's): no provider may touch it with the CPU.
    access |= fabric::kDeviceMemory;
    uint64_t offset = static_cast<uint64_t>(data - static_cast<char*>(pool.slab->data()));
    auto dmabuf = pool.slab->ExportDmabuf(offset, length);
    if (dmabuf.ok()) {
      region = fabric.RegisterDmabuf(data, length, {dmabuf->fd, dmabuf->offset}, access);
      ::close(dmabuf->fd);
      out.attempt.method = "DMA-BUF";
    } else {
      region = dmabuf.status();
    }
    if (!region.ok()) {
      why = absl::StrCat("DMA-BUF: ", region.status().message());
      // Peer memory: the NIC driver resolves the device pointer through nvidia-peermem (the
      // simulation: through transport/memory/peer_memory.h).
      region = fabric.Register(data, length, access);
      out.attempt.method = "peer memory";
    }
  }
  absl::MutexLock lock(&pool.mu);
  auto& reg = pool.registrations[rail];
  if (!region.ok()) {
    out.attempt.status = absl::FailedPreconditionError(absl::StrCat(
        "registering GPU cuda:", gpu, " memory with ", rail.ToString(), " failed (",
        why.empty() ? "" : absl::StrCat(why, "; "), region.status().message(),
        "); retrying after ", absl::FormatDuration(kRegistrationBackoff)));
    reg.retry_after = absl::Now() + kRegistrationBackoff;
  } else {
    out.region = *std::move(region);
  }
  reg.last = out.attempt;
  return out;
}

GpuPoolStats GpuPools::Stats(int gpu) const {
  Pool& pool = *pools_[gpu];
  GpuPoolStats stats;
  stats.index = gpu;
  stats.pci = pool.device->pci();
  stats.backend = pool.device->backend();
  absl::MutexLock lock(&pool.mu);
  stats.pool_bytes = pool.allocator->capacity();
  stats.used_bytes = pool.allocator->used();
  stats.fragmentation = pool.allocator->fragmentation();
  return stats;
}

}  // namespace ferry::server
