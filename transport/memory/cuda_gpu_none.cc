// CreateCudaGpus for builds without CUDA.
#include "transport/memory/gpu_device.h"

namespace ferry::memory {

absl::StatusOr<std::vector<std::unique_ptr<GpuDevice>>> CreateCudaGpus() {
  return absl::UnimplementedError("this ferryd was built without CUDA (nvcc not found)");
}

}  // namespace ferry::memory
