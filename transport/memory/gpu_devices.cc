#include "transport/memory/gpu_device.h"

#include "absl/strings/str_cat.h"

namespace ferry::memory {

absl::StatusOr<std::vector<std::unique_ptr<GpuDevice>>> CreateGpus(const GpuOptions& options,
                                                                   std::string* why) {
  std::vector<std::unique_ptr<GpuDevice>> gpus;
  if (options.backend == "none") {
    *why = "gpu: none (gpu.backend: none)";
    return gpus;
  }
  if (options.backend == "sim") {
    for (uint32_t i = 0; i < options.count; ++i) {
      std::string pci = i < options.sim_pci.size() ? options.sim_pci[i] : "";
      gpus.push_back(CreateSimGpu(static_cast<int>(i), pci, options.sim_copy_bytes_per_sec));
    }
    *why = absl::StrCat("gpu: ", options.count, " simulated GPU(s) (gpu.backend: sim); device "
                        "memory is host memory and copies run on a thread per GPU");
    return gpus;
  }
  auto cuda = CreateCudaGpus();
  if (options.backend == "cuda") {
    if (!cuda.ok()) return cuda.status();
    if (cuda->empty())
      return absl::FailedPreconditionError("gpu.backend is cuda but no GPU is visible");
    *why = absl::StrCat("gpu: ", cuda->size(), " CUDA GPU(s)");
    return cuda;
  }
  // auto: real GPUs if there are any; the simulation only when asked for.
  if (!cuda.ok()) {
    *why = absl::StrCat("gpu: none (", cuda.status().message(), ")");
    return gpus;
  }
  *why = cuda->empty() ? "gpu: none (no CUDA GPU visible)"
                       : absl::StrCat("gpu: ", cuda->size(), " CUDA GPU(s)");
  return cuda;
}

}  // namespace ferry::memory
