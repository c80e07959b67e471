// The simulation backend, as strict as a GPU about who may touch device memory. Each slab is
// a memfd mapped three times:
//
// - the device address (DeviceSlab::data()): mapped PROT_NONE, so the agent's CPU faults on
//   it exactly as it would on a cudaMalloc pointer, whose UVA range has no CPU pages;
// - the copy engine's own mapping: only the GPU's copy thread reads or writes it, after
//   translating a copy's device range, which must lie in one live slab (else the copy fails
//   as cudaMemcpyAsync does, with cudaErrorInvalidValue, and touches nothing);
// - the NIC's mapping, in the peer-memory table (peer_memory.h), the stand-in for
//   nvidia_peermem: how the tcp provider and the test fabrics reach GPU memory for GDR.
//
// Clients map the memfd themselves (GpuExport kind "shm"), as CUDA IPC gives them a device
// pointer of their own. Each GPU has one copy-engine thread that runs copies in order,
// optionally at a set bandwidth (PCIe is usually the slow stage of staging).

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/byte_size.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "transport/memory/device_ranges.h"
#include "transport/memory/gpu_device.h"
#include "transport/memory/peer_memory.h"
#include "transport/memory/vmm_mapping.h"

namespace ferry::memory {
namespace {

// A shared mapping of [offset, offset + bytes) of `fd` (the pointer is the byte at `offset`,
// which need not be page-aligned), unmapped when its last holder lets go.
absl::StatusOr<std::shared_ptr<char>> MapSlab(int fd, uint64_t bytes, int prot, const char* whose,
                                              uint64_t offset = 0) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t lead = offset % page;
  const uint64_t span = lead + bytes;
  void* p = mmap(nullptr, span, prot, MAP_SHARED, fd, static_cast<off_t>(offset - lead));
  if (p == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mmap(sim GPU slab, ", whose, ")"));
  }
  std::shared_ptr<char> mapping(static_cast<char*>(p), [span](char* q) { munmap(q, span); });
  return std::shared_ptr<char>(mapping, mapping.get() + lead);
}

class SimSlab : public DeviceSlab {
 public:
  // `fd_offset`: where the slab starts in `fd` (an imported range; 0 for the GPU's own).
  SimSlab(UniqueFd fd, std::shared_ptr<char> device, uint64_t size,
          std::shared_ptr<DeviceRanges> engine_ranges, uint64_t fd_offset = 0)
      : fd_(std::move(fd)),
        device_(std::move(device)),
        size_(size),
        fd_offset_(fd_offset),
        engine_ranges_(std::move(engine_ranges)) {}
  // Copies and registrations still holding the slab's bytes keep their mappings; the device
  // address itself is gone, as after cudaFree.
  ~SimSlab() override {
    PeerMemory().Remove(device_.get());
    engine_ranges_->Remove(device_.get());
  }

  void* data() const override { return device_.get(); }
  uint64_t size() const override { return size_; }
  absl::StatusOr<GpuExport> Export(uint64_t offset, uint64_t length) const override {
    if (offset > size_ || length > size_ - offset)
      return absl::OutOfRangeError("export outside the slab");
    GpuExport e;
    e.kind = "shm";
    e.path = absl::StrCat("/proc/", getpid(), "/fd/", fd_.get());
    e.offset = fd_offset_ + offset;
    e.length = length;
    return e;
  }
  absl::StatusOr<DmabufExport> ExportDmabuf(uint64_t, uint64_t) const override {
    return absl::UnimplementedError("simulated GPU: no DMA-BUF");
  }

 private:
  UniqueFd fd_;
  std::shared_ptr<char> device_;
  uint64_t size_;
  uint64_t fd_offset_;
  std::shared_ptr<DeviceRanges> engine_ranges_;
};

class SimGpu : public GpuDevice {
 public:
  SimGpu(int index, std::string pci, uint64_t bytes_per_sec)
      : index_(index), pci_(std::move(pci)), bytes_per_sec_(bytes_per_sec) {
    engine_ = std::thread([this] { Run(); });
  }
  ~SimGpu() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    engine_.join();
  }

  std::string backend() const override { return "sim"; }
  int index() const override { return index_; }
  std::string pci() const override { return pci_; }
  // As on a real GPU: device memory is reached by copies or by a NIC, never by the CPU.
  bool host_addressable() const override { return false; }

  absl::StatusOr<std::unique_ptr<DeviceSlab>> AllocateSlab(uint64_t bytes) override {
    UniqueFd fd(memfd_create(absl::StrCat("ferry-simgpu", index_).c_str(), MFD_CLOEXEC));
    if (!fd.valid()) return absl::ErrnoToStatus(errno, "memfd_create(sim GPU slab)");
    if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("ftruncate(sim GPU slab, ", bytes, ")"));
    }
    return MapDevice(std::move(fd), 0, bytes);
  }

  // The simulation's device memory is shared memory, so a client's own simulated allocation
  // comes as its file descriptor (as a VMM shareable handle does on CUDA); IPC handles are
  // CUDA's alone (cudaIpcOpenMemHandle fails on other memory with cudaErrorInvalidValue).
  absl::StatusOr<std::unique_ptr<DeviceSlab>> Import(const GpuImport& what) override {
    if (what.kind != "fd") {
      return absl::UnimplementedError(absl::StrCat(
          "simulated GPU ", index_, ": cannot import '", what.kind,
          "' memory (a simulated allocation is shared by its file descriptor)"));
    }
    if (what.length == 0) return absl::InvalidArgumentError("length: must be positive");
    // Only a simulated allocation's file, as cuMemImportFromShareableHandle takes only a
    // VMM handle's descriptor (CUDA_ERROR_INVALID_VALUE for any other).
    struct stat st = {};
    if (fstat(what.fd, &st) != 0) return absl::ErrnoToStatus(errno, "fd: fstat");
    const uint64_t allocation = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    if (allocation == 0 || allocation % kSimVmmGranularity != 0) {
      // cuMemCreate makes only sizes that are multiples of the granularity.
      return absl::InvalidArgumentError(absl::StrCat(
          "fd: simulated GPU ", index_, ": not a simulated VMM allocation (shared memory, a "
          "multiple of ", FormatByteSize(kSimVmmGranularity), " long)"));
    }
    // Mapped whole, as cuMemMap maps a handle (vmm_mapping.h): short of the allocation the
    // driver answers CUDA_ERROR_NOT_SUPPORTED (seen on an H200), past its end
    // CUDA_ERROR_INVALID_VALUE (cuMemMap(3): offset + size within the allocation).
    ASSIGN_OR_RETURN(const uint64_t mapped, VmmMappingSize(what, kSimVmmGranularity));
    if (mapped != allocation) {
      return absl::OutOfRangeError(absl::StrCat(
          "allocation_size: cuMemMap(sim GPU ", index_, ", ", FormatByteSize(mapped), "): ",
          mapped < allocation ? "operation not supported (CUDA_ERROR_NOT_SUPPORTED)"
                              : "invalid argument (CUDA_ERROR_INVALID_VALUE)",
          " (", VmmMappingHint(what), ")"));
    }
    UniqueFd fd(fcntl(what.fd, F_DUPFD_CLOEXEC, 0));
    if (!fd.valid()) return absl::ErrnoToStatus(errno, "fcntl(F_DUPFD_CLOEXEC)");
    return MapDevice(std::move(fd), what.offset, what.length);
  }
  absl::Status CopyToHost(void* host, const void* device, uint64_t n, CopyDone done) override {
    ASSIGN_OR_RETURN(std::shared_ptr<char> bytes, Translate(device, host, n, "D2H"));
    char* src = bytes.get();
    return Enqueue({static_cast<char*>(host), src, n, std::move(bytes), std::move(done)});
  }
  absl::Status CopyToDevice(void* device, const void* host, uint64_t n, CopyDone done) override {
    ASSIGN_OR_RETURN(std::shared_ptr<char> bytes, Translate(device, host, n, "H2D"));
    char* dst = bytes.get();
    return Enqueue({dst, static_cast<const char*>(host), n, std::move(bytes), std::move(done)});
  }
  absl::Status CopyFromDevice(void* dst, GpuDevice& src_gpu, const void* src, uint64_t n,
                              CopyDone done) override {
    auto* from = dynamic_cast<SimGpu*>(&src_gpu);
    if (from == nullptr) {
      // A real driver knows nothing of a simulated GPU's memory.
      return absl::InvalidArgumentError(absl::StrFormat(
          "cudaMemcpyPeerAsync(sim GPU %d <- %s GPU %d): invalid argument (cudaErrorInvalidValue)",
          index_, src_gpu.backend(), src_gpu.index()));
    }
    // Both ranges inside one live allocation of their GPU, as the driver checks them
    // (cudaErrorInvalidValue otherwise); the source's mapping is held until the copy ran.
    ASSIGN_OR_RETURN(std::shared_ptr<char> to, DeviceBytes(dst, n, "D2D", "destination"));
    ASSIGN_OR_RETURN(std::shared_ptr<char> bytes,
                     from->DeviceBytes(src, n, "D2D", "source"));
    char* src_bytes = bytes.get();
    return Enqueue({to.get(), src_bytes, n, std::move(bytes), std::move(done), std::move(to)});
  }
  std::string PeerCopyPath(const GpuDevice& src_gpu) const override {
    return &src_gpu == this ? "copy engine" : "P2P";
  }
  absl::Status PinHost(void*, uint64_t) override { return absl::OkStatus(); }
  void UnpinHost(void*) override {}

 private:
  struct Copy {
    char* dst;
    const char* src;
    uint64_t n;
    // The engine's bytes of the device range: mapped until the copy ran, even if the slab
    // is freed meanwhile (cudaFree waits for the copies in flight).
    std::shared_ptr<char> device_bytes;
    CopyDone done;
    std::shared_ptr<char> other_device_bytes = nullptr;  // D2D: the destination's range
  };

  // The copy engine's bytes for device range [device, device + n) of this GPU, or the
  // driver's refusal of a range outside every live allocation.
  absl::StatusOr<std::shared_ptr<char>> DeviceBytes(const void* device, uint64_t n,
                                                    const char* direction, const char* side) {
    std::shared_ptr<char> bytes = engine_ranges_->Find(device, n);
    if (bytes == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cudaMemcpyPeerAsync(sim GPU %d, %s, %s): %s range [%p, +%d) is not inside one "
          "allocation: invalid argument (cudaErrorInvalidValue)",
          index_, direction, FormatByteSize(n), side, device, n));
    }
    return bytes;
  }

  // The copy engine's bytes for device range [device, device + n), or the error that
  // cudaMemcpyAsync returns now for a range outside every live allocation of this GPU, or
  // for a "host" pointer that is device memory.
  absl::StatusOr<std::shared_ptr<char>> Translate(const void* device, const void* host, uint64_t n,
                                                  const char* direction) {
    auto refuse = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cudaMemcpyAsync(sim GPU %d, %s, %s): %s: invalid argument "
                          "(cudaErrorInvalidValue)",
                          index_, direction, FormatByteSize(n), why));
    };
    std::shared_ptr<char> bytes = engine_ranges_->Find(device, n);
    if (bytes == nullptr) {
      return refuse(
          absl::StrFormat("device range [%p, +%d) is not inside one allocation", device, n));
    }
    if (n > 0 && engine_ranges_->Find(host, 1) != nullptr) {
      return refuse(absl::StrFormat("host address %p is device memory", host));
    }
    return bytes;
  }

  // Maps [offset, offset + bytes) of `fd` as device memory: the device address (PROT_NONE),
  // the copy engine's mapping and the NIC's (peer memory), as the file header says.
  absl::StatusOr<std::unique_ptr<DeviceSlab>> MapDevice(UniqueFd fd, uint64_t offset,
                                                        uint64_t bytes) {
    ASSIGN_OR_RETURN(std::shared_ptr<char> device,
                     MapSlab(fd.get(), bytes, PROT_NONE, "device address", offset));
    ASSIGN_OR_RETURN(std::shared_ptr<char> engine,
                     MapSlab(fd.get(), bytes, PROT_READ | PROT_WRITE, "copy engine", offset));
    ASSIGN_OR_RETURN(std::shared_ptr<char> nic,
                     MapSlab(fd.get(), bytes, PROT_READ | PROT_WRITE, "peer memory", offset));
    RETURN_IF_ERROR(engine_ranges_->Add(device.get(), bytes, std::move(engine)));
    auto slab = std::make_unique<SimSlab>(std::move(fd), device, bytes, engine_ranges_, offset);
    RETURN_IF_ERROR(PeerMemory().Add(device.get(), bytes, std::move(nic)));
    return std::unique_ptr<DeviceSlab>(std::move(slab));
  }

  absl::Status Enqueue(Copy copy) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("simulated GPU is shutting down");
    queue_.push_back(std::move(copy));
    return absl::OkStatus();
  }

  void Run() {
    while (true) {
      Copy copy;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopping, and nothing left to do
        copy = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Time start = absl::Now();
      std::memcpy(copy.dst, copy.src, copy.n);
      copy.device_bytes.reset();
      copy.other_device_bytes.reset();
      if (bytes_per_sec_ > 0) {
        absl::Duration should = absl::Seconds(static_cast<double>(copy.n) / bytes_per_sec_);
        absl::SleepFor(should - (absl::Now() - start));
      }
      std::move(copy.done)(absl::OkStatus());
    }
  }

  const int index_;
  const std::string pci_;
  const uint64_t bytes_per_sec_;
  // This GPU's live slabs, by device address, with the copy engine's mapping of each.
  // Shared with the slabs, which may outlive the GPU object.
  const std::shared_ptr<DeviceRanges> engine_ranges_ = std::make_shared<DeviceRanges>();
  absl::Mutex mu_;
  std::deque<Copy> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread engine_;
};

}  // namespace

std::unique_ptr<GpuDevice> CreateSimGpu(int index, std::string pci, uint64_t copy_bytes_per_sec) {
  return std::make_unique<SimGpu>(index, std::move(pci), copy_bytes_per_sec);
}

}  // namespace ferry::memory
