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
#include "ferry/v1/agent.pb.h"
#include "transport/fabric.h"
#include "transport/memory/gpu_device.h"
#include "transport/memory/range_allocator.h"

namespace ferry::server {

// A buffer's memory, wherever it lives.
class BufferMemory {
 public:
  virtual ~BufferMemory() = default;
  // Host address, or device address for a GPU buffer.
  virtual char* data() const = 0;
  virtual uint64_t size() const = 0;
  virtual std::string device() const = 0;  // "host" or "cuda:N"
  virtual int gpu() const = 0;             // -1 for host memory
  virtual std::string backend() const = 0; // "host", "cuda" or "sim"
  // Tells the client how to map it.
  virtual void Describe(ferry::v1::BufferInfo* info) const = 0;
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

  // Registers [data, data+length) of GPU `gpu` with `fabric` for direct NIC access: DMA-BUF
  // first (the upstream kernel path, no out-of-tree module), then peer memory
  // (nvidia-peermem), then, for the simulation, plain host registration. A failure is
  // remembered for the GPU-fabric pair and not retried before the back-off passes.
  // `method` says how it was registered.
  absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterForGdr(
      int gpu, fabric::Fabric& fabric, char* data, uint64_t length, uint32_t access,
      std::string* method);
  // What happened last with GPU `gpu` and `provider`: "ibv_reg_dmabuf_mr", "failed: ...".
  std::string RegistrationState(int gpu, const std::string& provider) const;

  void Fill(int gpu, ferry::v1::GpuInfo* info) const;

 private:
  struct Pool {
    std::unique_ptr<memory::GpuDevice> device;
    std::unique_ptr<memory::DeviceSlab> slab;
    absl::Mutex mu;
    std::unique_ptr<memory::RangeAllocator> allocator ABSL_GUARDED_BY(mu);
    struct Registration {
      std::string state;     // method on success, "failed: why" otherwise
      bool failed = false;
      absl::Time retry_after;
    };
    std::map<std::string, Registration> registrations ABSL_GUARDED_BY(mu);
  };
  class Block;

  std::vector<std::unique_ptr<Pool>> pools_;
};

}  // namespace ferry::server
