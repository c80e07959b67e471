#pragma once
// The baseline of ferry-gpu-bench: one plain synchronous cudaMemcpy between a device buffer
// and one big pinned host buffer, the best rate the CUDA runtime itself reaches over this
// GPU's link. Without CUDA: UNIMPLEMENTED.

#include <cstdint>

#include "absl/status/statusor.h"

namespace ferry::bench {

// Seconds one cudaMemcpy of `n` bytes took on GPU `device` (device -> host when `to_host`).
absl::StatusOr<double> TimeCudaMemcpy(int device, void* dst, const void* src, uint64_t n,
                                      bool to_host);
// Seconds per cudaMemcpy D2D of `n` bytes between two buffers it allocates on GPU `device`
// (the best of `repeat`, after one untimed): what the same-node suite's GPU -> GPU rows
// stand beside.
absl::StatusOr<double> TimeCudaMemcpyD2D(int device, uint64_t n, int repeat);

}  // namespace ferry::bench
