// The CUDA memory backend on a real GPU (label `gpu`): slab allocation, asynchronous copies
// with data checks (many in flight, in order, chained from completions, staged through pinned
// bounce chunks), host pinning, DMA-BUF export and CUDA IPC mapping from a second process.
// Without a GPU (no driver, no device, or a build without CUDA) every test skips and says why.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/gpu_pattern.h"
#include "transport/memory/gpu_device.h"

extern char** environ;

namespace ferry::memory {
namespace {

using ferry::testing::FillPattern;
using ferry::testing::FirstMismatch;

constexpr uint64_t kMiB = 1 << 20;

// Host memory from mmap (page aligned, as bounce pools are), unmapped on destruction.
class HostBuffer {
 public:
  explicit HostBuffer(uint64_t n) : n_(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~HostBuffer() {
    if (data_ != nullptr) munmap(data_, n_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  char* data() const { return data_; }
  uint64_t size() const { return n_; }

 private:
  uint64_t n_;
  char* data_;
};

// Pins a HostBuffer for the test's lifetime of it.
class Pinned {
 public:
  Pinned(GpuDevice* gpu, const HostBuffer& buffer) : gpu_(gpu), data_(buffer.data()) {
    status_ = gpu->PinHost(buffer.data(), buffer.size());
  }
  ~Pinned() {
    if (status_.ok()) gpu_->UnpinHost(data_);
  }
  const absl::Status& status() const { return status_; }

 private:
  GpuDevice* gpu_;
  void* data_;
  absl::Status status_;
};

// Waits for a number of copy completions and keeps the first error.
class Completions {
 public:
  CopyDone Expect() {
    absl::MutexLock lock(&mu_);
    ++expected_;
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && first_error_.ok()) first_error_ = s;
      ++finished_;
    };
  }
  // OK when every expected copy finished without error within `timeout`.
  absl::Status Wait(absl::Duration timeout = absl::Seconds(60)) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return finished_ == expected_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all), timeout)) {
      return absl::DeadlineExceededError("copies did not complete");
    }
    return first_error_;
  }

 private:
  absl::Mutex mu_;
  int expected_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

class GpuMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gpus = CreateCudaGpus();
    std::string why;
    if (!gpus.ok()) {
      why = std::string(gpus.status().message());
    } else if (gpus->empty()) {
      why = "the CUDA driver sees no GPU";
    }
    if (!why.empty()) {
      std::printf("skipping: no CUDA GPU: %s\n", why.c_str());
      GTEST_SKIP() << "no CUDA GPU: " << why;
    }
    gpus_ = std::move(*gpus);
    gpu_ = gpus_[0].get();
  }

  // One copy, waited for.
  absl::Status CopyAndWait(bool to_host, void* dst, const void* src, uint64_t n) {
    Completions c;
    absl::Status posted = to_host ? gpu_->CopyToHost(dst, src, n, c.Expect())
                                  : gpu_->CopyToDevice(dst, src, n, c.Expect());
    if (!posted.ok()) return posted;
    return c.Wait();
  }

  std::vector<std::unique_ptr<GpuDevice>> gpus_;
  GpuDevice* gpu_ = nullptr;
};

TEST_F(GpuMemoryTest, DescribesItself) {
  EXPECT_EQ(gpu_->backend(), "cuda");
  EXPECT_EQ(gpu_->index(), 0);
  EXPECT_FALSE(gpu_->host_addressable());
  // The form hwloc and sysfs use, so topology and CUDA agree on which GPU is which.
  EXPECT_TRUE(
      std::regex_match(gpu_->pci(), std::regex("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]")))
      << gpu_->pci();
  std::printf("GPU 0 at %s (%zu GPU(s) visible)\n", gpu_->pci().c_str(), gpus_.size());
}

TEST_F(GpuMemoryTest, AllocatesSlabsAndExportsThemByIpcHandle) {
  auto slab = gpu_->AllocateSlab(256 * kMiB);
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_NE((*slab)->data(), nullptr);
  EXPECT_EQ((*slab)->size(), 256 * kMiB);

  auto e = (*slab)->Export(64 << 10, kMiB);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->kind, "cuda_ipc");
  EXPECT_EQ(e->handle.size(), 64u);  // sizeof(cudaIpcMemHandle_t)
  EXPECT_EQ(e->offset, 64u << 10);
  EXPECT_EQ(e->length, kMiB);
  // Every buffer of a slab carries the slab's one handle.
  auto other = (*slab)->Export(128 * kMiB, kMiB);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->handle, e->handle);
  EXPECT_EQ((*slab)->Export(256 * kMiB - 1, 2).status().code(), absl::StatusCode::kOutOfRange);

  // More slabs, then all freed (the unique_ptrs) without leaking device memory.
  std::vector<std::unique_ptr<DeviceSlab>> more;
  for (int i = 0; i < 4; ++i) {
    auto s = gpu_->AllocateSlab(64 * kMiB);
    ASSERT_TRUE(s.ok()) << s.status();
    more.push_back(std::move(*s));
  }
  EXPECT_NE(more[0]->data(), more[1]->data());

  auto huge = gpu_->AllocateSlab(uint64_t{1} << 50);  // 1 PiB
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("cudaMalloc"), absl::string_view::npos) << huge.status();
}

TEST_F(GpuMemoryTest, CopiesRoundTripWithDataChecks) {
  auto slab = gpu_->AllocateSlab(64 * kMiB);
  ASSERT_TRUE(slab.ok()) << slab.status();
  char* dev = static_cast<char*>((*slab)->data());
  HostBuffer src(64 * kMiB), dst(64 * kMiB);
  Pinned pin_src(gpu_, src), pin_dst(gpu_, dst);
  ASSERT_TRUE(pin_src.status().ok()) << pin_src.status();
  ASSERT_TRUE(pin_dst.status().ok()) << pin_dst.status();
  uint32_t seed = 10;
  for (uint64_t n : {uint64_t{1}, uint64_t{4096 + 3}, kMiB, 64 * kMiB}) {
    ++seed;
    FillPattern(src.data(), n, seed, 0);
    std::memset(dst.data(), 0, n);
    ASSERT_TRUE(CopyAndWait(false, dev, src.data(), n).ok());
    ASSERT_TRUE(CopyAndWait(true, dst.data(), dev, n).ok());
    EXPECT_EQ(FirstMismatch(dst.data(), n, seed, 0), n) << n << " bytes";
  }
  // Pageable (unpinned) host memory works too, only slower.
  std::vector<char> pageable(3 * kMiB + 17), back(3 * kMiB + 17);
  FillPattern(pageable.data(), pageable.size(), 99, 5);
  ASSERT_TRUE(CopyAndWait(false, dev + 5, pageable.data(), pageable.size()).ok());
  ASSERT_TRUE(CopyAndWait(true, back.data(), dev + 5, back.size()).ok());
  EXPECT_EQ(FirstMismatch(back.data(), back.size(), 99, 5), back.size());
}

TEST_F(GpuMemoryTest, ManyCopiesInFlightRunAndCompleteInSubmissionOrder) {
  constexpr int kChunks = 256;
  constexpr uint64_t kChunk = 256 << 10;
  auto slab = gpu_->AllocateSlab(kChunks * kChunk);
  ASSERT_TRUE(slab.ok()) << slab.status();
  char* dev = static_cast<char*>((*slab)->data());
  HostBuffer src(kChunks * kChunk), dst(kChunks * kChunk);
  Pinned pin_src(gpu_, src), pin_dst(gpu_, dst);
  ASSERT_TRUE(pin_src.status().ok() && pin_dst.status().ok());
  FillPattern(src.data(), src.size(), 7, 0);

  absl::Mutex mu;
  std::vector<int> order;
  Completions all;
  auto record = [&](int id) {
    return [&, id, done = all.Expect()](absl::Status s) mutable {
      {
        absl::MutexLock lock(&mu);
        order.push_back(id);
      }
      std::move(done)(s);
    };
  };
  // All 512 copies submitted before any is waited for: H2D of chunk i, then D2H of it.
  for (int i = 0; i < kChunks; ++i) {
    uint64_t at = i * kChunk;
    ASSERT_TRUE(gpu_->CopyToDevice(dev + at, src.data() + at, kChunk, record(2 * i)).ok());
    ASSERT_TRUE(gpu_->CopyToHost(dst.data() + at, dev + at, kChunk, record(2 * i + 1)).ok());
  }
  ASSERT_TRUE(all.Wait().ok());
  ASSERT_EQ(order.size(), 2u * kChunks);
  for (int i = 0; i < 2 * kChunks; ++i) ASSERT_EQ(order[i], i) << "completion out of order";
  EXPECT_EQ(FirstMismatch(dst.data(), dst.size(), 7, 0), dst.size());

  // Stream order on one location: write A, read, write B, read, all queued at once. Each
  // read must see the write submitted just before it.
  HostBuffer a(kMiB), b(kMiB), read_a(kMiB), read_b(kMiB);
  FillPattern(a.data(), kMiB, 1, 0);
  FillPattern(b.data(), kMiB, 2, 0);
  Completions c;
  ASSERT_TRUE(gpu_->CopyToDevice(dev, a.data(), kMiB, c.Expect()).ok());
  ASSERT_TRUE(gpu_->CopyToHost(read_a.data(), dev, kMiB, c.Expect()).ok());
  ASSERT_TRUE(gpu_->CopyToDevice(dev, b.data(), kMiB, c.Expect()).ok());
  ASSERT_TRUE(gpu_->CopyToHost(read_b.data(), dev, kMiB, c.Expect()).ok());
  ASSERT_TRUE(c.Wait().ok());
  EXPECT_EQ(FirstMismatch(read_a.data(), kMiB, 1, 0), kMiB);
  EXPECT_EQ(FirstMismatch(read_b.data(), kMiB, 2, 0), kMiB);
}

// The staging pipeline's shape: D2H of chunk i into a pinned bounce chunk, whose completion
// submits the H2D of that chunk to another place (the "peer"), whose completion frees the
// bounce chunk for chunk i + depth. Completions call back into the device; nothing deadlocks
// and every byte arrives.
TEST_F(GpuMemoryTest, StagedCopiesThroughPinnedBounceChunksChainFromCompletions) {
  constexpr uint64_t kTotal = 96 * kMiB, kChunk = 2 * kMiB;
  constexpr int kDepth = 4;
  auto from = gpu_->AllocateSlab(kTotal);
  auto to = gpu_->AllocateSlab(kTotal);
  ASSERT_TRUE(from.ok() && to.ok());
  char* src_dev = static_cast<char*>((*from)->data());
  char* dst_dev = static_cast<char*>((*to)->data());
  {
    HostBuffer fill(kTotal);
    FillPattern(fill.data(), kTotal, 21, 0);
    ASSERT_TRUE(CopyAndWait(false, src_dev, fill.data(), kTotal).ok());
  }
  HostBuffer bounce(kDepth * kChunk);
  Pinned pin(gpu_, bounce);
  ASSERT_TRUE(pin.status().ok()) << pin.status();

  absl::Mutex mu;
  std::vector<int> free_chunks;
  for (int i = 0; i < kDepth; ++i) free_chunks.push_back(i);
  int landed = 0;
  absl::Status error;
  const int chunks = static_cast<int>(kTotal / kChunk);
  for (int i = 0; i < chunks; ++i) {
    int slot;
    {
      absl::MutexLock lock(&mu);
      auto can_go = [&] { return !free_chunks.empty() || !error.ok(); };
      mu.Await(absl::Condition(&can_go));
      ASSERT_TRUE(error.ok()) << error;
      slot = free_chunks.back();
      free_chunks.pop_back();
    }
    char* staging = bounce.data() + slot * kChunk;
    uint64_t at = i * kChunk;
    absl::Status posted =
        gpu_->CopyToHost(staging, src_dev + at, kChunk, [&, slot, staging, at](absl::Status s) {
          if (s.ok()) {
            s = gpu_->CopyToDevice(dst_dev + at, staging, kChunk, [&, slot](absl::Status s2) {
              absl::MutexLock lock(&mu);
              if (!s2.ok() && error.ok()) error = s2;
              free_chunks.push_back(slot);
              ++landed;
            });
          }
          if (!s.ok()) {
            absl::MutexLock lock(&mu);
            if (error.ok()) error = s;
            free_chunks.push_back(slot);
            ++landed;
          }
        });
    ASSERT_TRUE(posted.ok()) << posted;
  }
  {
    absl::MutexLock lock(&mu);
    auto all = [&] { return landed == chunks; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60)));
    ASSERT_TRUE(error.ok()) << error;
  }
  HostBuffer check(kTotal);
  ASSERT_TRUE(CopyAndWait(true, check.data(), dst_dev, kTotal).ok());
  EXPECT_EQ(FirstMismatch(check.data(), kTotal, 21, 0), kTotal);
}

TEST_F(GpuMemoryTest, PinsAndUnpinsHostMemoryCountingPins) {
  HostBuffer host(32 * kMiB);
  ASSERT_TRUE(gpu_->PinHost(host.data(), host.size()).ok());
  // A bounce pool shared by several GPUs pins the same memory through each: counted.
  ASSERT_TRUE(gpu_->PinHost(host.data(), host.size()).ok());
  EXPECT_EQ(gpu_->PinHost(host.data(), kMiB).code(), absl::StatusCode::kFailedPrecondition);
  gpu_->UnpinHost(host.data());
  auto slab = gpu_->AllocateSlab(32 * kMiB);
  ASSERT_TRUE(slab.ok());
  FillPattern(host.data(), host.size(), 5, 0);
  ASSERT_TRUE(CopyAndWait(false, (*slab)->data(), host.data(), host.size()).ok());
  std::memset(host.data(), 0, host.size());
  ASSERT_TRUE(CopyAndWait(true, host.data(), (*slab)->data(), host.size()).ok());
  EXPECT_EQ(FirstMismatch(host.data(), host.size(), 5, 0), host.size());
  gpu_->UnpinHost(host.data());
  // Fully unregistered now: CUDA accepts it again (it refuses a range registered twice).
  ASSERT_TRUE(gpu_->PinHost(host.data(), host.size()).ok());
  gpu_->UnpinHost(host.data());
}

TEST_F(GpuMemoryTest, DmabufExportGivesAnFdOrSaysWhyNot) {
  auto slab = gpu_->AllocateSlab(64 * kMiB);
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_EQ((*slab)->ExportDmabuf(60 * kMiB, 8 * kMiB).status().code(),
            absl::StatusCode::kOutOfRange);
  auto e = (*slab)->ExportDmabuf(0, 64 * kMiB);
  if (!e.ok()) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kUnimplemented) << e.status();
    EXPECT_FALSE(e.status().message().empty());
    std::printf("DMA-BUF export unsupported here: %s\n", std::string(e.status().message()).c_str());
    return;
  }
  ASSERT_GE(e->fd, 0);
  EXPECT_EQ(e->offset, 0u);
  struct stat st;
  EXPECT_EQ(fstat(e->fd, &st), 0);
  close(e->fd);
  // A range not on page boundaries: the pages around it, and where it starts inside them.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  auto inner = (*slab)->ExportDmabuf(kMiB + 100, 1000);
  ASSERT_TRUE(inner.ok()) << inner.status();
  EXPECT_EQ(inner->offset, 100u);
  EXPECT_LT(inner->offset, page);
  close(inner->fd);
  std::printf("DMA-BUF export works (fd %d)\n", e->fd);
}

// The helper program's path: built beside this test; an environment variable overrides it
// (tests/gpu/run.sh does when it runs binaries copied from another build).
std::string HelperPath() {
  const char* env = std::getenv("FERRY_GPU_IPC_HELPER");
  return env != nullptr ? env : FERRY_GPU_IPC_HELPER;
}

TEST_F(GpuMemoryTest, AnotherProcessMapsTheSlabByIpcAndWritesIt) {
  constexpr uint64_t kOffset = kMiB, kLength = 4 * kMiB, kSpan = 6 * kMiB;
  auto slab = gpu_->AllocateSlab(64 * kMiB);
  ASSERT_TRUE(slab.ok()) << slab.status();
  char* dev = static_cast<char*>((*slab)->data());
  HostBuffer host(kSpan);
  FillPattern(host.data(), kSpan, 1, 0);
  ASSERT_TRUE(CopyAndWait(false, dev, host.data(), kSpan).ok());
  auto e = (*slab)->Export(kOffset, kLength);
  ASSERT_TRUE(e.ok()) << e.status();

  // The child checks seed 1 on [kOffset, +kLength) and writes seed 2 there.
  std::string helper = HelperPath();
  std::vector<std::string> args = {helper,
                                   absl::BytesToHexString(e->handle),
                                   std::to_string(e->offset),
                                   std::to_string(e->length),
                                   gpu_->pci(),
                                   "1",
                                   "2"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, helper.c_str(), nullptr, nullptr, argv.data(), environ), 0)
      << "cannot start " << helper;
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL() << "gpu_ipc_helper did not finish in 60 s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "gpu_ipc_helper failed (see its output)";

  ASSERT_TRUE(CopyAndWait(true, host.data(), dev, kSpan).ok());
  EXPECT_EQ(FirstMismatch(host.data(), kOffset, 1, 0), kOffset) << "written before the range";
  EXPECT_EQ(FirstMismatch(host.data() + kOffset, kLength, 2, kOffset), kLength)
      << "not the child's bytes";
  uint64_t end = kOffset + kLength;
  EXPECT_EQ(FirstMismatch(host.data() + end, kSpan - end, 1, end), kSpan - end)
      << "written after the range";
}

}  // namespace
}  // namespace ferry::memory
