// The simulation backend: "device" memory is shared host memory (a memfd, so clients map
// it as they map host buffers) and each GPU has one copy-engine thread that runs copies in
// order, optionally at a set bandwidth (PCIe is usually the slow stage of staging).

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "transport/memory/gpu_device.h"

namespace ferry::memory {
namespace {

class SimSlab : public DeviceSlab {
 public:
  SimSlab(UniqueFd fd, char* data, uint64_t size)
      : fd_(std::move(fd)), data_(data), size_(size) {}
  ~SimSlab() override { munmap(data_, size_); }

  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  absl::StatusOr<GpuExport> Export(uint64_t offset, uint64_t length) const override {
    if (offset > size_ || length > size_ - offset)
      return absl::OutOfRangeError("export outside the slab");
    GpuExport e;
    e.kind = "shm";
    e.path = absl::StrCat("/proc/", getpid(), "/fd/", fd_.get());
    e.offset = offset;
    e.length = length;
    return e;
  }
  absl::StatusOr<DmabufExport> ExportDmabuf(uint64_t, uint64_t) const override {
    return absl::UnimplementedError("simulated GPU: no DMA-BUF");
  }

 private:
  UniqueFd fd_;
  char* data_;
  uint64_t size_;
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
  bool host_addressable() const override { return true; }

  absl::StatusOr<std::unique_ptr<DeviceSlab>> AllocateSlab(uint64_t bytes) override {
    UniqueFd fd(memfd_create(absl::StrCat("ferry-simgpu", index_).c_str(), MFD_CLOEXEC));
    if (!fd.valid()) return absl::ErrnoToStatus(errno, "memfd_create(sim GPU slab)");
    if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("ftruncate(sim GPU slab, ", bytes, ")"));
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return absl::ErrnoToStatus(errno, "mmap(sim GPU slab)");
    return std::unique_ptr<DeviceSlab>(new SimSlab(std::move(fd), static_cast<char*>(p), bytes));
  }

  absl::Status CopyToHost(void* host, const void* device, uint64_t n, CopyDone done) override {
    return Enqueue(host, device, n, std::move(done));
  }
  absl::Status CopyToDevice(void* device, const void* host, uint64_t n, CopyDone done) override {
    return Enqueue(device, host, n, std::move(done));
  }
  absl::Status PinHost(void*, uint64_t) override { return absl::OkStatus(); }
  void UnpinHost(void*) override {}

 private:
  struct Copy {
    void* dst;
    const void* src;
    uint64_t n;
    CopyDone done;
  };

  absl::Status Enqueue(void* dst, const void* src, uint64_t n, CopyDone done) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("simulated GPU is shutting down");
    queue_.push_back({dst, src, n, std::move(done)});
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
