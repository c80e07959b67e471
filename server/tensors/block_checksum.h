#pragma once
// A block's CRC32C where it lives: host memory read in place, GPU memory copied to the host
// in pieces by its GPU's copy engine first (neither CUDA's device memory nor the
// simulation's is addressable by the CPU). MoveBlocks' verify computes it on both sides.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/buffers/buffer_registry.h"
#include "server/buffers/gpu_pools.h"

namespace ferry::server {

// The CRC32C of [offset, offset + length) of `buffer` (the caller checked the range).
// `scratch` is reused between calls for GPU copies; `gpus` may be null for host buffers.
// The copy's error (naming the call) for GPU memory that cannot be read.
absl::StatusOr<uint32_t> BlockCrc32c(const Buffer& buffer, uint64_t offset, uint64_t length,
                                     GpuPools* gpus, std::vector<char>& scratch);

}  // namespace ferry::server
