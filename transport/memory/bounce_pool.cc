#include "transport/memory/bounce_pool.h"

#include <sys/mman.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "transport/memory/numa_bind.h"

namespace ferry::memory {

absl::StatusOr<std::unique_ptr<BouncePool>> BouncePool::Create(std::string name, int numa,
                                                               uint64_t chunk_bytes,
                                                               uint32_t chunks,
                                                               std::vector<GpuDevice*> pin_with) {
  if (chunk_bytes == 0 || chunks == 0) return absl::InvalidArgumentError("bounce pool: empty");
  uint64_t size = chunk_bytes * chunks;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return absl::ErrnoToStatus(errno, absl::StrCat("mmap(bounce pool ", name, ", ", size, ")"));
  std::string placement = BindToNode(p, size, numa);
  std::vector<GpuDevice*> pinned;
  for (GpuDevice* gpu : pin_with) {
    absl::Status s = gpu->PinHost(p, size);
    if (!s.ok()) {
      for (GpuDevice* g : pinned) g->UnpinHost(p);
      munmap(p, size);
      return absl::Status(s.code(), absl::StrCat("bounce pool ", name, ": ", s.message()));
    }
    pinned.push_back(gpu);
  }
  if (!pinned.empty()) absl::StrAppend(&placement, ", pinned for ", pinned.size(), " GPU(s)");
  return std::unique_ptr<BouncePool>(new BouncePool(std::move(name), numa, static_cast<char*>(p),
                                                    chunk_bytes, chunks, std::move(placement),
                                                    std::move(pinned)));
}

BouncePool::BouncePool(std::string name, int numa, char* base, uint64_t chunk_bytes,
                       uint32_t chunks, std::string placement, std::vector<GpuDevice*> pinned)
    : name_(std::move(name)), numa_(numa), base_(base), chunk_bytes_(chunk_bytes), chunks_(chunks),
      placement_(std::move(placement)), pinned_(std::move(pinned)) {
  for (uint32_t i = chunks; i > 0; --i) free_.push_back(i - 1);
}

BouncePool::~BouncePool() {
  for (GpuDevice* g : pinned_) g->UnpinHost(base_);
  munmap(base_, size());
}

BouncePool::Lease& BouncePool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Return();
    pool_ = other.pool_;
    chunk_ = other.chunk_;
    other.pool_ = nullptr;
  }
  return *this;
}

void BouncePool::Lease::Return() {
  if (pool_ != nullptr) pool_->Release(chunk_);
  pool_ = nullptr;
}

BouncePool::Lease BouncePool::Acquire(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto available = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !free_.empty(); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&available), deadline)) return Lease();
  uint32_t chunk = free_.back();
  free_.pop_back();
  peak_ = std::max(peak_, chunks_ - static_cast<uint32_t>(free_.size()));
  return Lease(this, chunk);
}

void BouncePool::Release(uint32_t chunk) {
  absl::MutexLock lock(&mu_);
  free_.push_back(chunk);
}

uint32_t BouncePool::in_use() const {
  absl::MutexLock lock(&mu_);
  return chunks_ - static_cast<uint32_t>(free_.size());
}

uint32_t BouncePool::peak_in_use() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

}  // namespace ferry::memory
