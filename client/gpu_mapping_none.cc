// GPU mapping for builds without CUDA: every call says so.
#include "client/gpu_mapping.h"

namespace ferry {
namespace {

absl::Status NoCuda() {
  return absl::UnimplementedError("libferry was built without CUDA: GPU buffers cannot be mapped");
}

}  // namespace

absl::StatusOr<void*> OpenCudaIpc(const std::string&, uint64_t, int) { return NoCuda(); }
absl::Status CloseCudaIpc(const std::string&) { return NoCuda(); }
absl::StatusOr<int> CudaDeviceByPci(const std::string&) { return NoCuda(); }

}  // namespace ferry
