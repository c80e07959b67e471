#pragma once
// Registering a buffer's memory with the fabrics that can reach it, and what came of each
// attempt. The outcome stays structured (rail, method, status) so the planner decides from
// it; words are made only at the edges (results, ferryctl, logs).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/buffers/buffer_memory.h"
#include "transport/fabric.h"

namespace ferry::server {

class GpuPools;

// One fabric's registration of one buffer (or of a GPU's memory).
struct RegistrationAttempt {
  fabric::RailId rail;
  // How it was registered: "DMA-BUF", "peer memory", "host memory" (and "<backend> GPU
  // memory is host memory" for a GPU the CPU can address); for a failure, the methods tried.
  std::string method;
  absl::Status status;  // OK, or why this fabric cannot reach the memory

  // "verbs:mlx5_0: DMA-BUF", or the failure's message (which names GPU, rail and cause).
  std::string ToString() const;
};

using RegionList = std::vector<std::pair<fabric::RailId, std::unique_ptr<fabric::MemoryRegion>>>;

struct BufferRegistrations {
  RegionList regions;                        // the fabrics that reach the memory directly
  std::vector<RegistrationAttempt> attempts;  // GPU memory: one per fabric, failed ones too
};

// Registers `memory` with `access` on every fabric. Host memory must register with each
// (the error of the first that refuses is returned). GPU memory goes through `gpus`
// (GpuPools::RegisterForGdr: DMA-BUF, then peer memory); a fabric that cannot reach it is
// recorded as a failed attempt and leaves the buffer to staging.
absl::StatusOr<BufferRegistrations> RegisterWithFabrics(const BufferMemory& memory,
                                                        const std::vector<fabric::Fabric*>& fabrics,
                                                        uint32_t access, GpuPools* gpus);

}  // namespace ferry::server
