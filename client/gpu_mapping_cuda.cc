// CUDA IPC mappings, shared per handle within the process.
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/gpu_mapping.h"
#include "transport/memory/cuda_status.h"

namespace ferry {
namespace {

using memory::CudaStatus;
using memory::ScopedCudaDevice;

// Open handles and how many Buffers use each. cudaIpcOpenMemHandle refuses (or, on some
// drivers, silently aliases) a second open of the same handle in one process, and ferryd
// hands out many buffers from one slab, all with the slab's handle.
class IpcMappings {
 public:
  static IpcMappings& Get() {
    static IpcMappings* mappings = new IpcMappings;  // never destroyed: used until exit
    return *mappings;
  }

  absl::StatusOr<void*> Open(const std::string& handle_bytes, uint64_t offset, int device) {
    cudaIpcMemHandle_t handle;
    if (handle_bytes.size() != sizeof(handle)) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA IPC handle of ", handle_bytes.size(),
                                                     " bytes; expected ", sizeof(handle)));
    }
    std::memcpy(&handle, handle_bytes.data(), sizeof(handle));
    absl::MutexLock lock(&mu_);
    auto it = open_.find(handle_bytes);
    if (it == open_.end()) {
      ScopedCudaDevice d(device);
      if (!d.status().ok()) return d.status();
      void* base = nullptr;
      // Lazy peer access: lets the mapping work when `device` is not the GPU that holds the
      // memory (P2P between them), at no cost when it is.
      absl::Status s =
          CudaStatus(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
                     absl::StrCat("cudaIpcOpenMemHandle(device ", device, ")"));
      if (!s.ok()) return s;
      it = open_.emplace(handle_bytes, Mapping{base, 0}).first;
    }
    ++it->second.users;
    return static_cast<char*>(it->second.base) + offset;
  }

  absl::Status Close(const std::string& handle_bytes) {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(handle_bytes);
    if (it == open_.end())
      return absl::NotFoundError("CUDA IPC handle is not open in this process");
    if (--it->second.users > 0) return absl::OkStatus();
    void* base = it->second.base;
    open_.erase(it);
    return CudaStatus(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
  }

 private:
  struct Mapping {
    void* base;
    int users;
  };
  absl::Mutex mu_;
  std::map<std::string, Mapping> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<void*> OpenCudaIpc(const std::string& handle_bytes, uint64_t offset, int device) {
  return IpcMappings::Get().Open(handle_bytes, offset, device);
}

absl::Status CloseCudaIpc(const std::string& handle_bytes) {
  return IpcMappings::Get().Close(handle_bytes);
}

absl::StatusOr<int> CudaDeviceByPci(const std::string& pci) {
  int device = -1;
  absl::Status s = CudaStatus(cudaDeviceGetByPCIBusId(&device, pci.c_str()),
                              absl::StrCat("cudaDeviceGetByPCIBusId(", pci, ")"));
  if (!s.ok()) return s;
  return device;
}

}  // namespace ferry
