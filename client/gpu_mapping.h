#pragma once
// Maps ferryd's GPU memory into a client process by CUDA IPC. The agent exports a buffer as
// the IPC handle of the pool slab that holds it plus an offset (GpuExport kind "cuda_ipc");
// CUDA IPC maps whole allocations, and a process may open a given handle only once, so
// mappings are shared: each handle is opened on first use and closed after its last user.
//
// Thread-safe. Built with CUDA: gpu_mapping_cuda.cc; without: gpu_mapping_none.cc, whose
// functions return UNIMPLEMENTED.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry {

// The device address of byte `offset` of the allocation named by `handle_bytes` (the raw
// cudaIpcMemHandle_t, 64 bytes), mapped into this process on CUDA device `device` (this
// process's ordinal; see CudaDeviceByPci). Each successful call needs one CloseCudaIpc.
// Errors: INVALID_ARGUMENT for a malformed handle; the cudaIpcOpenMemHandle error otherwise.
absl::StatusOr<void*> OpenCudaIpc(const std::string& handle_bytes, uint64_t offset, int device);

// Ends one OpenCudaIpc of `handle_bytes`; the last one unmaps (cudaIpcCloseMemHandle).
// NOT_FOUND when the handle is not open. The caller must have finished its GPU work on the
// memory (synchronized) before the last close.
absl::Status CloseCudaIpc(const std::string& handle_bytes);

// The CUDA ordinal, in this process's numbering (CUDA_VISIBLE_DEVICES applies), of the GPU
// at PCI address `pci` ("0000:3b:00.0"). The agent's "cuda:N" uses the agent's numbering,
// which differs when the two processes see different device lists.
absl::StatusOr<int> CudaDeviceByPci(const std::string& pci);

}  // namespace ferry
