#pragma once
// One device-memory pool per GPU: a slab allocated once and carved into buffers (64 KiB
// aligned), and the pool's registration with each fabric for GPUDirect RDMA. A failed
// registration is remembered per GPU-fabric pair, with a back-off before it is tried again;
// meanwhile that GPU's transfers are staged, with the failure as the reason.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/buffers/buffer_memory.h"
#include "server/buffers/registration.h"
#include "transport/fabric.h"
#include "transport/memory/gpu_device.h"
#include "transport/memory/range_allocator.h"

namespace ferry::server {

// What GetInfo and metrics read of one GPU's pool.
struct GpuPoolStats {
  int index = 0;
  std::string pci;
  std::string backend;
  uint64_t pool_bytes = 0;
  uint64_t used_bytes = 0;
  double fragmentation = 0;
};

// A GPU registration with one fabric: the region when it worked, and the attempt either way.
struct GdrRegistration {
  std::unique_ptr<fabric::MemoryRegion> region;
  RegistrationAttempt attempt;
};

class GpuPools {
 public:
  static constexpr uint64_t kAlignment = 64 << 10;
  static constexpr absl::Duration kRegistrationBackoff = absl::Seconds(30);

  static absl::StatusOr<std::unique_ptr<GpuPools>> Create(
      std::vector<std::unique_ptr<memory::GpuDevice>> gpus, uint64_t pool_bytes);
  ~GpuPools();

  size_t count() const { return pools_.size(); }
  memory::GpuDevice& device(int gpu) const { return *pools_[gpu]->device; }

  // NOT_FOUND naming the device for an index without a GPU; RESOURCE_EXHAUSTED when full.
  absl::StatusOr<std::unique_ptr<BufferMemory>> Allocate(int gpu, uint64_t size);
  // A client's own allocation on GPU `gpu`, imported (GpuDevice::Import) as a registered
  // buffer's memory; the import is undone when the memory is dropped. NOT_FOUND as Allocate.
  absl::StatusOr<std::unique_ptr<BufferMemory>> Import(int gpu, const memory::GpuImport& what);

  // Registers [data, data+length) of GPU `gpu` with `fabric` for direct NIC access: DMA-BUF
  // first (the upstream kernel path, no out-of-tree module), then peer memory
  // (nvidia-peermem; how the simulation's GPUs are reached); device memory the CPU can
  // address registers as host memory. A failure is remembered for the GPU-fabric pair and
  // not retried before the back-off passes.
  // The attempt says how it was registered, or why not (FAILED_PRECONDITION naming the GPU,
  // the rail and each method's error).
  GdrRegistration RegisterForGdr(int gpu, fabric::Fabric& fabric, char* data, uint64_t length,
                                 uint32_t access);

  GpuPoolStats Stats(int gpu) const;

 private:
  struct Pool {
    std::unique_ptr<memory::GpuDevice> device;
    std::unique_ptr<memory::DeviceSlab> slab;
    absl::Mutex mu;
    std::unique_ptr<memory::RangeAllocator> allocator ABSL_GUARDED_BY(mu);
    // The last attempt per rail; a failed one is not tried again before retry_after.
    struct Registration {
      RegistrationAttempt last;
      absl::Time retry_after;
    };
    std::map<fabric::RailId, Registration> registrations ABSL_GUARDED_BY(mu);
  };
  class Block;
  class Imported;

  std::vector<std::unique_ptr<Pool>> pools_;
};

}  // namespace ferry::server
