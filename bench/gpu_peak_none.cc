// TimeCudaMemcpy for builds without CUDA.
#include "bench/gpu_peak.h"

namespace ferry::bench {

absl::StatusOr<double> TimeCudaMemcpy(int, void*, const void*, uint64_t, bool) {
  return absl::UnimplementedError("built without CUDA");
}

absl::StatusOr<double> TimeCudaMemcpyD2D(int, uint64_t, int) {
  return absl::UnimplementedError("built without CUDA");
}

}  // namespace ferry::bench
