// The CUDA backend of GpuDevice: one pool slab per cudaMalloc, exported by CUDA IPC handle and
// by DMA-BUF; copies on one non-blocking stream per GPU, completed by a poller thread per GPU.
//
// Linked against the static CUDA runtime (CUDA::cudart_static) and never against libcuda: the
// driver API calls it needs (DMA-BUF export, device attributes) are looked up at run time
// with cudaGetDriverEntryPointByVersion. So ferryd starts on machines without an NVIDIA
// driver, where CreateCudaGpus says why there are no GPUs instead of failing to load.

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <cctype>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/byte_size.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"
#include "transport/memory/cuda_status.h"
#include "transport/memory/gpu_device.h"
#include "transport/memory/vmm_mapping.h"

namespace ferry::memory {
namespace {

// ---- Driver entry points ----------------------------------------------------------------

// The few driver API functions the runtime has no equivalent for. Each is null when the
// driver does not have it; `why_missing` then says so.
struct DriverApi {
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuPointerSetAttribute_v6000 pointer_set_attribute = nullptr;
  PFN_cuMemGetHandleForAddressRange_v11070 get_handle_for_address_range = nullptr;
  PFN_cuMemGetAddressRange_v3020 mem_get_address_range = nullptr;
  // Virtual memory management: importing a client's VMM allocation by its shareable fd.
  PFN_cuMemImportFromShareableHandle_v10020 mem_import = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 mem_get_properties = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  std::string why_missing;
  std::string why_no_vmm;  // the VMM entry points that are missing, "" when all are there
};

// The ABI version the PFN_ types above are declared for (CUDA 12.0): asking by version keeps
// the signatures fixed even when a later driver adds a new variant of a function.
constexpr unsigned int kDriverAbiVersion = 12000;

template <typename Fn>
void LoadEntryPoint(const char* symbol, Fn* fn, std::string* why_missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbiVersion, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    if (err != cudaSuccess) (void)cudaGetLastError();
    absl::StrAppend(why_missing, why_missing->empty() ? "" : "; ", symbol, " not available (",
                    err != cudaSuccess ? cudaGetErrorString(err)
                    : found == cudaDriverEntryPointVersionNotSufficent
                        ? "driver too old"
                        : "symbol not found",
                    ")");
    return;
  }
  *fn = reinterpret_cast<Fn>(p);
}

// Loaded once, after the runtime is known to work (CreateCudaGpus found a device).
const DriverApi& Driver() {
  static const DriverApi* api = [] {
    auto* a = new DriverApi;
    LoadEntryPoint("cuGetErrorString", &a->get_error_string, &a->why_missing);
    LoadEntryPoint("cuDeviceGet", &a->device_get, &a->why_missing);
    LoadEntryPoint("cuDeviceGetAttribute", &a->device_get_attribute, &a->why_missing);
    LoadEntryPoint("cuPointerSetAttribute", &a->pointer_set_attribute, &a->why_missing);
    LoadEntryPoint("cuMemGetHandleForAddressRange", &a->get_handle_for_address_range,
                   &a->why_missing);
    LoadEntryPoint("cuMemGetAddressRange", &a->mem_get_address_range, &a->why_missing);
    LoadEntryPoint("cuMemImportFromShareableHandle", &a->mem_import, &a->why_no_vmm);
    LoadEntryPoint("cuMemGetAllocationPropertiesFromHandle", &a->mem_get_properties,
                   &a->why_no_vmm);
    LoadEntryPoint("cuMemGetAllocationGranularity", &a->mem_get_granularity, &a->why_no_vmm);
    LoadEntryPoint("cuMemAddressReserve", &a->mem_address_reserve, &a->why_no_vmm);
    LoadEntryPoint("cuMemAddressFree", &a->mem_address_free, &a->why_no_vmm);
    LoadEntryPoint("cuMemMap", &a->mem_map, &a->why_no_vmm);
    LoadEntryPoint("cuMemUnmap", &a->mem_unmap, &a->why_no_vmm);
    LoadEntryPoint("cuMemSetAccess", &a->mem_set_access, &a->why_no_vmm);
    LoadEntryPoint("cuMemRelease", &a->mem_release, &a->why_no_vmm);
    return a;
  }();
  return *api;
}

std::string DriverErrorString(CUresult r) {
  const char* text = nullptr;
  if (Driver().get_error_string != nullptr) Driver().get_error_string(r, &text);
  return text != nullptr ? absl::StrCat(text, " (CUresult ", static_cast<int>(r), ")")
                         : absl::StrCat("CUresult ", static_cast<int>(r));
}

// ---- RAII owners ------------------------------------------------------------------------

struct DeviceMemoryDeleter {
  int device;
  bool ipc = false;  // opened with cudaIpcOpenMemHandle: closed, not freed
  // Mapped from a VMM handle (cuMemMap over an address range this process reserved, of this
  // many bytes): unmapped and the range freed; the client's allocation lives on.
  uint64_t vmm_bytes = 0;
  void operator()(void* p) const noexcept {
    ScopedCudaDevice d(device);
    if (vmm_bytes > 0) {
      const auto ptr = reinterpret_cast<CUdeviceptr>(p);
      for (auto [name, r] :
           {std::pair{"cuMemUnmap", Driver().mem_unmap(ptr, vmm_bytes)},
            std::pair{"cuMemAddressFree", Driver().mem_address_free(ptr, vmm_bytes)}}) {
        if (r != CUDA_SUCCESS) spdlog::warn("{}(GPU {}): {}", name, device, DriverErrorString(r));
      }
      return;
    }
    cudaError_t err = ipc ? cudaIpcCloseMemHandle(p) : cudaFree(p);
    if (err != cudaSuccess) {
      spdlog::warn("{}", CudaStatus(err, absl::StrCat(ipc ? "cudaIpcCloseMemHandle" : "cudaFree",
                                                      "(GPU ", device, ")"))
                             .ToString());
    }
  }
};
using DeviceMemory = std::unique_ptr<void, DeviceMemoryDeleter>;

struct StreamDeleter {
  void operator()(CUstream_st* s) const noexcept { (void)cudaStreamDestroy(s); }
};
using UniqueStream = std::unique_ptr<CUstream_st, StreamDeleter>;

struct EventDeleter {
  void operator()(CUevent_st* e) const noexcept { (void)cudaEventDestroy(e); }
};
using UniqueEvent = std::unique_ptr<CUevent_st, EventDeleter>;

// "0000:3B:00.0" or "00000000:3b:00.0" -> "0000:3b:00.0", the form hwloc and sysfs use.
std::string NormalizePciBusId(std::string id) {
  absl::AsciiStrToLower(&id);
  size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4) {
    size_t extra = colon - 4;
    if (id.find_first_not_of('0') >= extra) id.erase(0, extra);
  }
  return id;
}

// ---- Host registration --------------------------------------------------------------------

// Pinned ranges, process wide. Memory is registered once with cudaHostRegisterPortable,
// which makes it pinned for every CUDA context, and counted: a bounce pool shared by several
// GPUs is pinned through each of them, and CUDA refuses a second registration of a range
// (cudaErrorHostMemoryAlreadyRegistered).
class PinRegistry {
 public:
  static PinRegistry& Get() {
    static PinRegistry* registry = new PinRegistry;
    return *registry;
  }

  absl::Status Pin(int device, void* host, uint64_t n) {
    absl::MutexLock lock(&mu_);
    auto it = pins_.find(host);
    if (it != pins_.end()) {
      if (it->second.bytes != n) {
        return absl::FailedPreconditionError(
            absl::StrCat("cudaHostRegister(", FormatByteSize(n), "): ",
                         absl::Hex(reinterpret_cast<uintptr_t>(host)), " is already pinned as ",
                         FormatByteSize(it->second.bytes)));
      }
      ++it->second.count;
      return absl::OkStatus();
    }
    ScopedCudaDevice d(device);
    RETURN_IF_ERROR(d.status());
    RETURN_IF_ERROR(CudaStatus(cudaHostRegister(host, n, cudaHostRegisterPortable),
                               absl::StrCat("cudaHostRegister(GPU ", device, ", ",
                                            FormatByteSize(n), ", portable)")));
    pins_[host] = {n, 1};
    return absl::OkStatus();
  }

  void Unpin(int device, void* host) {
    absl::MutexLock lock(&mu_);
    auto it = pins_.find(host);
    if (it == pins_.end()) {
      spdlog::warn("cudaHostUnregister(GPU {}): {} was not pinned by ferry", device, host);
      return;
    }
    if (--it->second.count > 0) return;
    pins_.erase(it);
    ScopedCudaDevice d(device);
    absl::Status s =
        CudaStatus(cudaHostUnregister(host), absl::StrCat("cudaHostUnregister(GPU ", device, ")"));
    if (!s.ok()) spdlog::warn("{}", s.ToString());
  }

 private:
  struct Pinned {
    uint64_t bytes;
    int count;
  };
  absl::Mutex mu_;
  std::map<void*, Pinned> pins_ ABSL_GUARDED_BY(mu_);
};

// ---- Slab -------------------------------------------------------------------------------------

class CudaSlab : public DeviceSlab {
 public:
  // `handle`: the slab's CUDA IPC handle bytes, or why there is none. `start`: where the
  // slab begins in `memory` (an imported range of another process's allocation; else 0).
  CudaSlab(int device, DeviceMemory memory, uint64_t size, absl::StatusOr<std::string> handle,
           std::string dmabuf_unsupported, uint64_t start = 0)
      : device_(device),
        memory_(std::move(memory)),
        start_(start),
        size_(size),
        handle_(std::move(handle)),
        dmabuf_unsupported_(std::move(dmabuf_unsupported)) {}

  void* data() const override { return static_cast<char*>(memory_.get()) + start_; }
  uint64_t size() const override { return size_; }

  // The handle names the whole allocation (CUDA IPC maps allocations, not sub-ranges); the
  // client opens it once and adds `offset`.
  absl::StatusOr<GpuExport> Export(uint64_t offset, uint64_t length) const override {
    RETURN_IF_ERROR(CheckRange("export", offset, length));
    if (!handle_.ok()) return handle_.status();
    GpuExport e;
    e.kind = "cuda_ipc";
    e.handle = *handle_;
    e.offset = start_ + offset;
    e.length = length;
    return e;
  }

  // DMA-BUF is the upstream kernel's way for a NIC to DMA into GPU memory (ibv_reg_dmabuf_mr):
  // no out-of-tree nvidia-peermem module, and it is what NCCL prefers when the driver offers
  // it. It needs the NVIDIA open kernel modules and a Linux kernel with DMA-BUF P2P support;
  // elsewhere this is UNIMPLEMENTED and the caller falls back to peer memory.
  absl::StatusOr<DmabufExport> ExportDmabuf(uint64_t offset, uint64_t length) const override {
    RETURN_IF_ERROR(CheckRange("DMA-BUF export", offset, length));
    if (!dmabuf_unsupported_.empty()) return absl::UnimplementedError(dmabuf_unsupported_);
    // The driver takes only host-page-aligned ranges: export the pages around the range and
    // say where the range starts inside the DMA-BUF.
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t base = reinterpret_cast<uint64_t>(data());
    const uint64_t start = (base + offset) & ~(page - 1);
    const uint64_t end = (base + offset + length + page - 1) & ~(page - 1);
    int fd = -1;
    CUresult r = Driver().get_handle_for_address_range(
        &fd, static_cast<CUdeviceptr>(start), end - start, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS) {
      // Whatever the driver's reason, this memory cannot go to the NIC as a DMA-BUF: say so
      // the way callers expect (UNIMPLEMENTED), so they fall back to peer memory.
      return absl::UnimplementedError(
          absl::StrCat("cuMemGetHandleForAddressRange(GPU ", device_, ", DMA_BUF_FD, ",
                       FormatByteSize(end - start), "): ", DriverErrorString(r)));
    }
    return DmabufExport{fd, base + offset - start};
  }

 private:
  absl::Status CheckRange(absl::string_view what, uint64_t offset, uint64_t length) const {
    if (offset > size_ || length > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat(what, " [", offset, ", +", length,
                                                ") is outside the GPU ", device_, " slab of ",
                                                FormatByteSize(size_)));
    }
    return absl::OkStatus();
  }

  const int device_;
  const DeviceMemory memory_;
  const uint64_t start_;
  const uint64_t size_;
  const absl::StatusOr<std::string> handle_;
  const std::string dmabuf_unsupported_;
};

// ---- Device -------------------------------------------------------------------------------------

class CudaGpu : public GpuDevice {
 public:
  static absl::StatusOr<std::unique_ptr<CudaGpu>> Create(int index) {
    ScopedCudaDevice d(index);
    RETURN_IF_ERROR(d.status());
    char bus_id[32] = {};
    RETURN_IF_ERROR(CudaStatus(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), index),
                               absl::StrCat("cudaDeviceGetPCIBusId(", index, ")")));
    // Non-blocking: the stream never waits for work on the legacy default stream (a client's
    // or a library's synchronous cudaMemcpy in this process), so staging keeps flowing.
    cudaStream_t stream = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                               absl::StrCat("cudaStreamCreateWithFlags(GPU ", index, ")")));
    return std::unique_ptr<CudaGpu>(
        new CudaGpu(index, NormalizePciBusId(bus_id), UniqueStream(stream), DmabufSupport(index)));
  }

  ~CudaGpu() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    poller_.join();  // runs every copy already submitted to completion first
  }

  std::string backend() const override { return "cuda"; }
  int index() const override { return index_; }
  std::string pci() const override { return pci_; }
  bool host_addressable() const override { return false; }

  absl::StatusOr<std::unique_ptr<DeviceSlab>> AllocateSlab(uint64_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("GPU slab of 0 bytes");
    ScopedCudaDevice d(index_);
    RETURN_IF_ERROR(d.status());
    void* p = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), absl::StrCat("cudaMalloc(GPU ", index_, ", ",
                                                                   FormatByteSize(bytes), ")")));
    DeviceMemory memory(p, DeviceMemoryDeleter{index_});
    // NVIDIA's GPUDirect RDMA guide: with SYNC_MEMOPS set, synchronous CUDA copies touching
    // this memory complete before they return, so bytes a NIC reads right after a client's
    // cudaMemcpy are the new ones. Best effort: without it only that ordering guarantee is lost.
    if (Driver().pointer_set_attribute != nullptr) {
      unsigned int one = 1;
      CUresult r = Driver().pointer_set_attribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                                                  reinterpret_cast<CUdeviceptr>(p));
      if (r != CUDA_SUCCESS) {
        spdlog::warn("cuPointerSetAttribute(GPU {}, SYNC_MEMOPS): {}", index_,
                     DriverErrorString(r));
      }
    }
    // Without an IPC handle the slab still serves GDR and staging; only mapping it into
    // clients fails, and Export says why.
    cudaIpcMemHandle_t ipc;
    absl::StatusOr<std::string> handle;
    absl::Status ipc_status = CudaStatus(cudaIpcGetMemHandle(&ipc, p),
                                         absl::StrCat("cudaIpcGetMemHandle(GPU ", index_, ")"));
    if (ipc_status.ok()) {
      handle = std::string(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
    } else {
      handle = ipc_status;
    }
    return std::unique_ptr<DeviceSlab>(
        new CudaSlab(index_, std::move(memory), bytes, handle, dmabuf_unsupported_));
  }

  // A client's allocation by IPC handle, opened with this GPU current (a stale handle fails
  // with cudaErrorInvalidResourceHandle) and kept only if it is this GPU's memory.
  absl::StatusOr<std::unique_ptr<DeviceSlab>> Import(const GpuImport& what) override {
    if (what.kind == "fd") return ImportVmm(what);
    if (what.kind != "cuda_ipc") {
      return absl::InvalidArgumentError(absl::StrCat(
          "GPU ", index_, ": cannot import '", what.kind,
          "' memory (a CUDA IPC handle or a VMM shareable fd)"));
    }
    if (what.handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc_handle: ", what.handle.size(),
                                                     " bytes, a cudaIpcMemHandle_t has ",
                                                     sizeof(cudaIpcMemHandle_t)));
    }
    if (what.length == 0) return absl::InvalidArgumentError("length: must be positive");
    ScopedCudaDevice d(index_);
    RETURN_IF_ERROR(d.status());
    cudaIpcMemHandle_t ipc;
    std::memcpy(&ipc, what.handle.data(), sizeof(ipc));
    void* p = nullptr;
    RETURN_IF_ERROR(
        CudaStatus(cudaIpcOpenMemHandle(&p, ipc, cudaIpcMemLazyEnablePeerAccess),
                   absl::StrCat("cuda_ipc_handle: cudaIpcOpenMemHandle(GPU ", index_, ")")));
    DeviceMemory memory(p, DeviceMemoryDeleter{index_, true});
    // The handle names an allocation of whichever GPU made it, and with peer access enabled
    // it opens on another GPU too: memory of a GPU other than this one is refused rather
    // than planned as this GPU's (its NIC, its DMA-BUF export, its copy engine).
    cudaPointerAttributes attributes = {};
    RETURN_IF_ERROR(CudaStatus(cudaPointerGetAttributes(&attributes, p),
                               absl::StrCat("cudaPointerGetAttributes(GPU ", index_, ")")));
    if (attributes.device != index_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device: the handle names memory of GPU ", attributes.device, " of this agent, not of ",
          "GPU ", index_, " (CUDA ordinals differ between processes: name the GPU as the agent ",
          "numbers it, by its PCI address in GetInfo)"));
    }
    // The allocation's extent bounds the range (cuMemGetAddressRange on the opened base); a
    // range not known to fit is refused: an access past the allocation would poison this
    // process's CUDA context for every client.
    size_t extent = 0;
    CUdeviceptr base = 0;
    if (Driver().mem_get_address_range == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("cuda_ipc_handle: cannot bound the range: ", Driver().why_missing));
    }
    if (CUresult r =
            Driver().mem_get_address_range(&base, &extent, reinterpret_cast<CUdeviceptr>(p));
        r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc_handle: cuMemGetAddressRange(GPU ", index_, "): ", DriverErrorString(r)));
    }
    if (what.offset > extent || what.length > extent - what.offset) {
      return absl::OutOfRangeError(absl::StrCat("length: [", what.offset, ", +", what.length,
                                                ") is outside the ", FormatByteSize(extent),
                                                " allocation the handle names"));
    }
    return std::unique_ptr<DeviceSlab>(new CudaSlab(index_, std::move(memory), what.length,
                                                    what.handle, dmabuf_unsupported_,
                                                    what.offset));
  }

  absl::Status CopyToHost(void* host, const void* device, uint64_t n, CopyDone done) override {
    return Submit(
        absl::StrCat("cudaMemcpyAsync(GPU ", index_, ", D2H, ", FormatByteSize(n), ")"),
        [&](cudaStream_t s) { return cudaMemcpyAsync(host, device, n, cudaMemcpyDeviceToHost, s); },
        std::move(done));
  }

  // A client's VMM allocation (cuMemCreate, exported with cuMemExportToShareableHandle as a
  // POSIX fd, as PyTorch's expandable segments make them): imported, mapped into an address
  // range of our own and made readable and writable by this GPU, and [offset, offset +
  // length) of it registered. cuMemMap maps from the allocation's start (its offset must be
  // 0, cuMemMap(3)) and maps it whole: on an H200 (driver 580) a size short of the
  // allocation fails CUDA_ERROR_NOT_SUPPORTED, as a size past its end fails. The handle
  // does not say its size, so the client does (allocation_size), or the range runs to the
  // allocation's end.
  absl::StatusOr<std::unique_ptr<DeviceSlab>> ImportVmm(const GpuImport& what) {
    const DriverApi& api = Driver();
    if (!api.why_no_vmm.empty()) {
      return absl::UnimplementedError(
          absl::StrCat("fd: this driver cannot import VMM memory: ", api.why_no_vmm));
    }
    if (what.fd < 0) return absl::InvalidArgumentError("fd: no descriptor");
    if (what.length == 0) return absl::InvalidArgumentError("length: must be positive");
    ScopedCudaDevice d(index_);
    RETURN_IF_ERROR(d.status());
    auto call = [&](const char* name, CUresult r) -> absl::Status {
      if (r == CUDA_SUCCESS) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat("fd: ", name, "(GPU ", index_, "): ", DriverErrorString(r)));
    };
    CUmemGenericAllocationHandle handle = 0;
    RETURN_IF_ERROR(call("cuMemImportFromShareableHandle",
                         api.mem_import(&handle, reinterpret_cast<void*>(
                                                     static_cast<uintptr_t>(what.fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
    // The mapping holds the allocation; our handle to it goes whatever happens next.
    struct Released {
      const DriverApi& api;
      CUmemGenericAllocationHandle h;
      ~Released() { api.mem_release(h); }
    } released{api, handle};
    CUmemAllocationProp prop = {};
    RETURN_IF_ERROR(call("cuMemGetAllocationPropertiesFromHandle",
                         api.mem_get_properties(&prop, handle)));
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != index_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device: the descriptor names memory of ",
          prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE
              ? absl::StrCat("GPU ", prop.location.id, " of this agent")
              : std::string("the host"),
          ", not of GPU ", index_, " (name the GPU as the agent numbers it, in GetInfo)"));
    }
    size_t granularity = 0;
    RETURN_IF_ERROR(call("cuMemGetAllocationGranularity",
                         api.mem_get_granularity(&granularity, &prop,
                                                 CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
    if (granularity == 0) granularity = 2 << 20;
    ASSIGN_OR_RETURN(const uint64_t bytes, VmmMappingSize(what, granularity));
    CUdeviceptr base = 0;
    RETURN_IF_ERROR(call("cuMemAddressReserve", api.mem_address_reserve(&base, bytes, 0, 0, 0)));
    if (CUresult r = api.mem_map(base, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
      api.mem_address_free(base, bytes);
      return absl::OutOfRangeError(absl::StrCat(
          "allocation_size: cuMemMap(GPU ", index_, ", ", FormatByteSize(bytes), "): ",
          DriverErrorString(r), " (", VmmMappingHint(what), ")"));
    }
    DeviceMemory memory(reinterpret_cast<void*>(base), DeviceMemoryDeleter{index_, false, bytes});
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = index_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    RETURN_IF_ERROR(call("cuMemSetAccess", api.mem_set_access(base, bytes, &access, 1)));
    // Clients map it by their own fd; a CUDA IPC handle cannot name VMM memory.
    return std::unique_ptr<DeviceSlab>(new CudaSlab(
        index_, std::move(memory), what.length,
        absl::FailedPreconditionError(
            "memory registered by VMM fd is mapped by the client that owns it, not exported"),
        dmabuf_unsupported_, what.offset));
  }
  absl::Status CopyToDevice(void* device, const void* host, uint64_t n, CopyDone done) override {
    return Submit(
        absl::StrCat("cudaMemcpyAsync(GPU ", index_, ", H2D, ", FormatByteSize(n), ")"),
        [&](cudaStream_t s) { return cudaMemcpyAsync(device, host, n, cudaMemcpyHostToDevice, s); },
        std::move(done));
  }
  absl::Status CopyFromDevice(void* dst, GpuDevice& src_gpu, const void* src, uint64_t n,
                              CopyDone done) override {
    if (src_gpu.backend() != "cuda") {
      return absl::InvalidArgumentError(absl::StrCat("cudaMemcpyPeerAsync(GPU ", index_, " <- ",
                                                     src_gpu.backend(), " GPU ", src_gpu.index(),
                                                     "): not a CUDA device"));
    }
    const int from = src_gpu.index();
    if (from == index_) {
      return Submit(
          absl::StrCat("cudaMemcpyAsync(GPU ", index_, ", D2D, ", FormatByteSize(n), ")"),
          [&](cudaStream_t s) { return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s); },
          std::move(done));
    }
    return Submit(absl::StrCat("cudaMemcpyPeerAsync(GPU ", index_, " <- GPU ", from, ", ",
                               FormatByteSize(n), ")"),
                  [&](cudaStream_t s) { return cudaMemcpyPeerAsync(dst, index_, src, from, n, s); },
                  std::move(done));
  }
  std::string PeerCopyPath(const GpuDevice& src_gpu) const override {
    if (src_gpu.index() == index_) return "copy engine";
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, index_, src_gpu.index()) != cudaSuccess) can = 0;
    return can ? "P2P" : "peer copy via host";
  }

  absl::Status PinHost(void* host, uint64_t n) override {
    return PinRegistry::Get().Pin(index_, host, n);
  }
  void UnpinHost(void* host) override { PinRegistry::Get().Unpin(index_, host); }

 private:
  struct Pending {
    UniqueEvent event;
    CopyDone done;
  };

  CudaGpu(int index, std::string pci, UniqueStream stream, std::string dmabuf_unsupported)
      : index_(index),
        pci_(std::move(pci)),
        dmabuf_unsupported_(std::move(dmabuf_unsupported)),
        stream_(std::move(stream)) {
    poller_ = std::thread([this] { Poll(); });
  }

  // Empty when this GPU can export DMA-BUFs, else the reason it cannot.
  static std::string DmabufSupport(int index) {
    const DriverApi& api = Driver();
    if (api.get_handle_for_address_range == nullptr || api.device_get == nullptr ||
        api.device_get_attribute == nullptr) {
      return absl::StrCat("GPU ", index, ": no DMA-BUF export: ", api.why_missing);
    }
    CUdevice dev = 0;
    int supported = 0;
    CUresult r = api.device_get(&dev, index);
    if (r == CUDA_SUCCESS)
      r = api.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev);
    if (r != CUDA_SUCCESS) {
      return absl::StrCat("GPU ", index,
                          ": cuDeviceGetAttribute(DMA_BUF_SUPPORTED): ", DriverErrorString(r));
    }
    if (supported == 0) {
      return absl::StrCat("GPU ", index,
                          " reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0 (DMA-BUF "
                          "export needs the NVIDIA open kernel modules and Linux >= 5.12)");
    }
    return "";
  }

  // Copies go on the GPU's one stream, so they run in submission order; an event recorded
  // after each marks its completion. `mu_` is held across the enqueue so that stream order
  // and the order of `pending_` agree.
  // `call` names the copy in its error; `enqueue` queues it on the stream it is given.
  absl::Status Submit(const std::string& call,
                      absl::FunctionRef<cudaError_t(cudaStream_t stream)> enqueue, CopyDone done) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError(absl::StrCat("GPU ", index_, " is shutting down"));
    ScopedCudaDevice d(index_);
    RETURN_IF_ERROR(d.status());
    UniqueEvent event;
    if (!free_events_.empty()) {
      event = std::move(free_events_.back());
      free_events_.pop_back();
    } else {
      // BlockingSync: cudaEventSynchronize sleeps rather than spins once the poller has
      // stopped spinning itself (see WaitFor). No timing: cheaper to record.
      cudaEvent_t e = nullptr;
      RETURN_IF_ERROR(
          CudaStatus(cudaEventCreateWithFlags(&e, cudaEventBlockingSync | cudaEventDisableTiming),
                     absl::StrCat("cudaEventCreateWithFlags(GPU ", index_, ")")));
      event.reset(e);
    }
    absl::Status s = CudaStatus(enqueue(stream_.get()), call);
    if (s.ok()) {
      s = CudaStatus(cudaEventRecord(event.get(), stream_.get()),
                     absl::StrCat("cudaEventRecord(GPU ", index_, ")"));
    }
    if (!s.ok()) {
      // Either nothing was queued, or the copy was but its event was not (then nothing
      // could report its completion). Both are errors now, and `done` never runs.
      free_events_.push_back(std::move(event));
      return s;
    }
    pending_.push_back({std::move(event), std::move(done)});
    return absl::OkStatus();
  }

  // Waits for one event. Copies of staging chunks take tens of microseconds, and a sleeping
  // wait (interrupt + wake-up) would add about as much to each, so spin briefly first; a
  // long copy then sleeps in cudaEventSynchronize instead of burning a core.
  absl::Status WaitFor(cudaEvent_t event) {
    constexpr auto kSpin = std::chrono::microseconds(100);
    auto until = std::chrono::steady_clock::now() + kSpin;
    while (true) {
      cudaError_t err = cudaEventQuery(event);
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotReady) return CudaStatus(err, absl::StrCat("copy on GPU ", index_));
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::yield();
    }
    return CudaStatus(cudaEventSynchronize(event), absl::StrCat("copy on GPU ", index_));
  }

  // The completion thread. Host callbacks (cudaLaunchHostFunc) would be simpler but run on a
  // CUDA-internal thread that must not call CUDA, while `done` usually submits the next copy
  // (the staging pipeline does); and a host function stalls its stream while it runs. Own
  // thread + events: `done` may call back into this device, and the stream never waits.
  void Poll() {
    while (true) {
      Pending p;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !pending_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (pending_.empty()) return;  // stopping, and every copy has completed
        p = std::move(pending_.front());
        pending_.pop_front();
      }
      absl::Status s = WaitFor(p.event.get());
      {
        absl::MutexLock lock(&mu_);
        free_events_.push_back(std::move(p.event));
      }
      std::move(p.done)(std::move(s));
    }
  }

  const int index_;
  const std::string pci_;
  const std::string dmabuf_unsupported_;
  UniqueStream stream_;
  absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<UniqueEvent> free_events_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poller_;  // last: joined in the destructor before the stream and events go
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<GpuDevice>>> CreateCudaGpus() {
  std::vector<std::unique_ptr<GpuDevice>> gpus;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice) {
    (void)cudaGetLastError();
    return gpus;  // a driver, but no GPU it can see (or CUDA_VISIBLE_DEVICES hides them all)
  }
  RETURN_IF_ERROR(CudaStatus(err, "cudaGetDeviceCount"));
  for (int i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(auto gpu, CudaGpu::Create(i));
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

}  // namespace ferry::memory
