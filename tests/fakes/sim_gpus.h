#pragma once
// GPU pools over simulated GPUs (memory::CreateGpus, backend "sim"), for unit tests that need
// GPU buffers or staging without a GPU. Their bytes go in and out through the copy engine
// (tests/fakes/gpu_copies.h): the CPU cannot touch device memory.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/buffers/gpu_pools.h"
#include "tests/fakes/gpu_copies.h"
#include "transport/memory/gpu_device.h"

namespace ferry::fake {

inline absl::StatusOr<std::unique_ptr<server::GpuPools>> SimGpuPools(
    uint32_t count = 1, uint64_t pool_bytes = 16 * server::GpuPools::kAlignment) {
  memory::GpuOptions options;
  options.backend = "sim";
  options.count = count;
  std::string why;
  auto devices = memory::CreateGpus(options, &why);
  if (!devices.ok()) return devices.status();
  return server::GpuPools::Create(std::move(*devices), pool_bytes);
}

}  // namespace ferry::fake
