#pragma once
// absl::Status from CUDA runtime results: the failing call (with its arguments) plus
// cudaGetErrorName / cudaGetErrorString, and a status code a caller can act on. Only
// for files built with CUDA (cuda_gpu.cc, client/gpu_mapping_cuda.cc, the GPU benchmark).

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry::memory {

inline absl::StatusCode CudaStatusCode(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return absl::StatusCode::kOk;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
      return absl::StatusCode::kUnimplemented;
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::StatusCode::kAlreadyExists;
    case cudaErrorHostMemoryNotRegistered:
      return absl::StatusCode::kNotFound;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

// "cudaMalloc(GPU 0, 1 GiB): out of memory (cudaErrorMemoryAllocation)". OK for cudaSuccess.
// Also clears the runtime's last-error slot, so a later, unrelated cudaGetLastError does not
// report this (non-sticky) failure again.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view call) {
  if (err == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  std::string message = absl::StrCat(call, ": ", cudaGetErrorString(err), " (",
                                      cudaGetErrorName(err), ")");
  if (err == cudaErrorInsufficientDriver) {
    absl::StrAppend(&message,
                    "; no NVIDIA driver is loaded, or it is older than this CUDA runtime");
  }
  return absl::Status(CudaStatusCode(err), message);
}

// Makes `device` current for the calling thread and restores the previous device on exit,
// so a call into ferry never changes which GPU the caller's thread works on (this matters
// in libferry, which runs inside applications).
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int device) {
    // A thread without a context reports device 0; "restoring" that would create a context
    // on GPU 0 (hundreds of MiB) in a process that may never use GPU 0.
    if (!HasCurrentContext() || cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) {
      status_ = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
    }
  }
  ~ScopedCudaDevice() {
    if (previous_ >= 0 && status_.ok()) (void)cudaSetDevice(previous_);
  }
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;
  // Not OK when the device could not be made current.
  const absl::Status& status() const { return status_; }

 private:
  // cuCtxGetCurrent through the runtime's driver entry points (ferry never links libcuda).
  // True when unknown, so the previous device is restored as a plain runtime program would.
  static bool HasCurrentContext() {
    static const PFN_cuCtxGetCurrent_v4000 get_current = [] {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &p, 12000, cudaEnableDefault,
                                           &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        p = nullptr;
      }
      return reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(p);
    }();
    if (get_current == nullptr) return true;
    CUcontext context = nullptr;
    return get_current(&context) == CUDA_SUCCESS && context != nullptr;
  }

  int previous_ = -1;
  absl::Status status_;
};

}  // namespace ferry::memory
