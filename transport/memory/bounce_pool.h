#pragma once
// Pinned host memory next to a NIC, cut into fixed chunks for staging GPU data through host
// memory. Bound to the NIC's NUMA node (hwloc), so the NIC's DMA and the GPU copy do not
// cross the socket interconnect a second time. Chunks are taken and given back; the pool
// counts what is in use and the peak, which bounds memory whatever the transfer size.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/memory/gpu_device.h"

namespace ferry::memory {

class BouncePool {
 public:
  // One chunk, held: move-only, and the chunk goes back to the pool when the lease is
  // dropped, on whatever path (done, failed, cancelled). The pool must outlive its leases.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept : pool_(other.pool_), chunk_(other.chunk_) {
      other.pool_ = nullptr;
    }
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Return(); }

    explicit operator bool() const { return pool_ != nullptr; }
    uint32_t chunk() const { return chunk_; }
    char* data() const { return pool_->chunk_data(chunk_); }
    uint64_t length() const { return pool_->chunk_bytes(); }

   private:
    friend class BouncePool;
    Lease(BouncePool* pool, uint32_t chunk) : pool_(pool), chunk_(chunk) {}
    void Return();
    BouncePool* pool_ = nullptr;
    uint32_t chunk_ = 0;
  };

  // `numa` -1: no binding. `pin_with`: GPUs that copy through this memory (each pins it).
  static absl::StatusOr<std::unique_ptr<BouncePool>> Create(std::string name, int numa,
                                                            uint64_t chunk_bytes, uint32_t chunks,
                                                            std::vector<GpuDevice*> pin_with);
  ~BouncePool();

  // A free chunk, waiting until `deadline` for one; an empty lease on timeout.
  Lease Acquire(absl::Time deadline);

  char* chunk_data(uint32_t chunk) const {
    return base_ + static_cast<uint64_t>(chunk) * chunk_bytes_;
  }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint32_t chunks() const { return chunks_; }
  char* data() const { return base_; }
  uint64_t size() const { return static_cast<uint64_t>(chunks_) * chunk_bytes_; }
  const std::string& name() const { return name_; }
  int numa() const { return numa_; }
  // How the memory was placed, e.g. "NUMA node 1 (hwloc membind), pinned" or why not.
  const std::string& placement() const { return placement_; }

  uint32_t in_use() const;
  uint32_t peak_in_use() const;

 private:
  void Release(uint32_t chunk);  // only through Lease
  BouncePool(std::string name, int numa, char* base, uint64_t chunk_bytes, uint32_t chunks,
             std::string placement, std::vector<GpuDevice*> pinned);

  const std::string name_;
  const int numa_;
  char* const base_;
  const uint64_t chunk_bytes_;
  const uint32_t chunks_;
  const std::string placement_;
  const std::vector<GpuDevice*> pinned_;

  mutable absl::Mutex mu_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  uint32_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::memory
