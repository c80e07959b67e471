// TimeCudaMemcpy: cudaMemcpy timed by the wall clock (it returns when the copy is done, so
// the wall clock is the copy's time plus one call's overhead, negligible at the sizes used).
#include <chrono>

#include "absl/strings/str_cat.h"
#include "bench/gpu_peak.h"
#include "transport/memory/cuda_status.h"

namespace ferry::bench {

absl::StatusOr<double> TimeCudaMemcpy(int device, void* dst, const void* src, uint64_t n,
                                      bool to_host) {
  memory::ScopedCudaDevice d(device);
  if (!d.status().ok()) return d.status();
  auto start = std::chrono::steady_clock::now();
  absl::Status s = memory::CudaStatus(
      cudaMemcpy(dst, src, n, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice),
      absl::StrCat("cudaMemcpy(GPU ", device, ", ", to_host ? "D2H" : "H2D", ", ", n, " bytes)"));
  if (!s.ok()) return s;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::StatusOr<double> TimeCudaMemcpyD2D(int device, uint64_t n, int repeat) {
  memory::ScopedCudaDevice d(device);
  if (!d.status().ok()) return d.status();
  void* a = nullptr;
  void* b = nullptr;
  absl::Status s = memory::CudaStatus(cudaMalloc(&a, n), absl::StrCat("cudaMalloc(", n, ")"));
  if (s.ok()) s = memory::CudaStatus(cudaMalloc(&b, n), absl::StrCat("cudaMalloc(", n, ")"));
  double best = 0;
  for (int i = 0; s.ok() && i <= repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    s = memory::CudaStatus(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice),
                           absl::StrCat("cudaMemcpy(GPU ", device, ", D2D, ", n, " bytes)"));
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0 && (best == 0 || took < best)) best = took;  // the first one warms up
  }
  if (a != nullptr) cudaFree(a);
  if (b != nullptr) cudaFree(b);
  if (!s.ok()) return s;
  return best;
}

}  // namespace ferry::bench
