#pragma once
// GPU memory behind one interface, whatever provides it: CUDA (real GPUs) or the host
// simulation that lets the planner and the staging pipeline run on machines without one.
// Every result says which backend ran.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry::memory {

// How a client maps part of a slab into its own process.
struct GpuExport {
  // "cuda_ipc": open `handle` (a cudaIpcMemHandle_t) with cudaIpcOpenMemHandle and add
  // `offset`. "shm": open `path` and mmap [offset, offset+length) (the simulation).
  std::string kind;
  std::string handle;
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A DMA-BUF exporting device memory, for NIC registration (ibv_reg_dmabuf_mr). The caller
// owns and closes `fd`.
struct DmabufExport {
  int fd = -1;
  uint64_t offset = 0;
};

// One GPU's pool slab: device memory allocated once and carved into buffers.
class DeviceSlab {
 public:
  virtual ~DeviceSlab() = default;
  // Device address: for the copy engine and NIC registration only; the CPU must not touch
  // it (CUDA: no CPU pages behind it; the simulation maps it PROT_NONE so a CPU access
  // faults in tests as it would on a GPU).
  virtual void* data() const = 0;
  virtual uint64_t size() const = 0;
  virtual absl::StatusOr<GpuExport> Export(uint64_t offset, uint64_t length) const = 0;
  // UNIMPLEMENTED where the driver cannot export DMA-BUFs (then peer memory is tried).
  virtual absl::StatusOr<DmabufExport> ExportDmabuf(uint64_t offset, uint64_t length) const = 0;
};

// Device memory that another process allocated, as that process shares it.
//   kind "fd": a file descriptor. CUDA: a VMM shareable handle (cuMemExportToShareableHandle,
//     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, as expandable segments give). The simulation:
//     the shared memory behind the client's simulated device memory. A handle is mapped
//     whole (the driver refuses a mapping shorter than its allocation), so [offset, offset +
//     length) is a range inside [0, allocation_size).
//   kind "cuda_ipc": `handle` is a cudaIpcMemHandle_t (cudaIpcGetMemHandle) of an allocation;
//     [offset, offset + length) of it is imported.
struct GpuImport {
  std::string kind;
  int fd = -1;  // borrowed: the device keeps what it needs (a mapping, a duplicate)
  std::string handle;
  uint64_t offset = 0;
  uint64_t length = 0;
  // kind "fd": the size of the allocation the handle names (cuMemCreate's size); 0: offset +
  // length rounded up to the allocation granularity, right when the range runs to its end.
  uint64_t allocation_size = 0;
};

// Runs exactly once when a copy finished (or failed), on the device's copy thread.
using CopyDone = absl::AnyInvocable<void(absl::Status) &&>;

class GpuDevice {
 public:
  virtual ~GpuDevice() = default;

  virtual std::string backend() const = 0;  // "cuda" or "sim"
  virtual int index() const = 0;            // CUDA ordinal / simulated index
  virtual std::string pci() const = 0;      // "0000:3b:00.0", "" when unknown
  // True when the CPU (and so a provider that moves bytes with it) can address device
  // memory directly, as on a cache-coherent GPU. Neither backend here: CUDA device memory,
  // and the simulation's, is reached only by copies or by a NIC (DMA-BUF or peer memory).
  virtual bool host_addressable() const = 0;

  virtual absl::StatusOr<std::unique_ptr<DeviceSlab>> AllocateSlab(uint64_t bytes) = 0;
  // Maps memory another process shares into this device's address space, as a slab of
  // exactly the imported range (data() is its first byte); unmapped when the slab is dropped.
  // UNIMPLEMENTED for a kind the backend cannot import; the driver's error otherwise.
  virtual absl::StatusOr<std::unique_ptr<DeviceSlab>> Import(const GpuImport& what) = 0;

  // Asynchronous copies on the device's copy engine, run in submission order. Either an
  // error now (`done` never runs; INVALID_ARGUMENT for a device range outside the GPU's
  // allocations, as cudaErrorInvalidValue) or OK and `done` runs later on the copy thread.
  virtual absl::Status CopyToHost(void* host, const void* device, uint64_t n, CopyDone done) = 0;
  virtual absl::Status CopyToDevice(void* device, const void* host, uint64_t n, CopyDone done) = 0;
  // Device -> device, on this GPU's stream: `dst` in this GPU's memory, `src` in `src_gpu`'s
  // (this GPU: one D2D copy; another: cudaMemcpyPeerAsync, which the driver routes over
  // NVLink or PCIe peer to peer where the two can access each other, else through host
  // memory). As above: an error now (INVALID_ARGUMENT for a range outside either GPU's
  // allocations, or a GPU of another backend) or OK and `done` later.
  virtual absl::Status CopyFromDevice(void* dst, GpuDevice& src_gpu, const void* src, uint64_t n,
                                      CopyDone done) = 0;
  // How CopyFromDevice from `src_gpu` moves the bytes, in words for a transfer's legs:
  // "copy engine" (one GPU), "P2P" (cudaDeviceCanAccessPeer), "peer copy via host".
  virtual std::string PeerCopyPath(const GpuDevice& src_gpu) const = 0;

  // Page-locks host memory for full-speed DMA (cudaHostRegister); the simulation has nothing
  // to do. Unpin before freeing the memory.
  virtual absl::Status PinHost(void* host, uint64_t n) = 0;
  virtual void UnpinHost(void* host) = 0;
};

struct GpuOptions {
  // "auto": CUDA GPUs when built with CUDA and a driver sees some, else none.
  // "cuda": CUDA GPUs, an error without them. "sim": `count` simulated GPUs. "none".
  std::string backend = "auto";
  uint32_t count = 0;
  // Simulated copy-engine bandwidth in bytes/s (0: as fast as memcpy), so a test or a
  // benchmark can make the copy stage the slow one, as PCIe is.
  uint64_t sim_copy_bytes_per_sec = 0;
  // PCI addresses for simulated GPUs (from the topology), by index; missing ones are "".
  std::vector<std::string> sim_pci;
};

// The GPUs this agent will use. `why` gets a line saying what was found and why.
absl::StatusOr<std::vector<std::unique_ptr<GpuDevice>>> CreateGpus(const GpuOptions& options,
                                                                   std::string* why);

// The CUDA backend (transport/memory/cuda_gpu.cc when built with CUDA; otherwise it says
// it was not built). An empty vector when the driver sees no GPU.
absl::StatusOr<std::vector<std::unique_ptr<GpuDevice>>> CreateCudaGpus();

// The simulation backend (sim_gpu.cc): device memory the CPU cannot touch, a copy engine,
// and peer memory (peer_memory.h) through which NICs reach it.
std::unique_ptr<GpuDevice> CreateSimGpu(int index, std::string pci, uint64_t copy_bytes_per_sec);

}  // namespace ferry::memory
