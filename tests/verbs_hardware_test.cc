// The verbs provider on a real RDMA NIC (label `rdma`): the same handshake and ops as the
// model-backed tests, against rdma-core, loopback on the first active port. Host memory by
// ibv_reg_mr; CUDA memory by DMA-BUF (ibv_reg_dmabuf_mr), the way ferryd registers its GPU
// pools, WRITE and READ between GPU and host and GPU to GPU. Tiny ops from GPU memory are the
// ones that once crashed: inline sends, whose payload the CPU copies, cannot read GPU memory.
//
// GPU bytes are put in and checked through the CUDA copy engine (GpuDevice), never by the
// CPU reading device memory. Without a NIC, a GPU, or a CUDA build, tests skip and say why.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/completion_waiter.h"
#include "transport/memory/gpu_copy_wait.h"
#include "tests/gpu_pattern.h"
#include "transport/memory/gpu_device.h"
#include "transport/verbs/rdma_core_api.h"
#include "transport/verbs/verbs_fabric.h"

namespace ferry::verbs {
namespace {

using ferry::memory::CopyAndWait;
using ferry::testing::FillPattern;
using ferry::testing::FirstMismatch;

constexpr uint64_t kMiB = 1 << 20;
// Every op lands this far into the target, and the bytes either side of it are checked to be
// untouched: a misplaced or overlong op shows.
constexpr uint64_t kTargetOffset = 4096 + 7;
constexpr uint64_t kRegionBytes = 4 * kMiB;
// 1, 8 and 64 bytes are at or below the default inline threshold (VerbsOptions, 64): the
// provider must not inline them from GPU memory. The rest: a partial page, a large op.
constexpr uint64_t kSizes[] = {1, 8, 64, 65, 4096 + 3, kMiB};

// Registered memory of one kind on one fabric: host memory, or a CUDA slab by DMA-BUF. Bytes
// go in and out by memcpy (host) or by the GPU's copy engine (device).
class TestMemory {
 public:
  static std::unique_ptr<TestMemory> Host(VerbsFabric& fabric, uint32_t access) {
    auto m = std::unique_ptr<TestMemory>(new TestMemory());
    m->host_.assign(kRegionBytes, 0);
    auto region = fabric.Register(m->host_.data(), kRegionBytes, access);
    EXPECT_TRUE(region.ok()) << region.status();
    if (!region.ok()) return nullptr;
    EXPECT_EQ((*region)->registration(), "ibv_reg_mr");
    m->region_ = *std::move(region);
    return m;
  }

  // A slab of `gpu`, exported as a DMA-BUF and registered with ibv_reg_dmabuf_mr as
  // server/buffers/gpu_pools.cc does (kDeviceMemory: the provider may move it by DMA only).
  // Sets `skip` instead where this GPU or NIC cannot do DMA-BUF at all.
  static std::unique_ptr<TestMemory> Gpu(VerbsFabric& fabric, memory::GpuDevice& gpu,
                                         uint32_t access, std::string* skip) {
    auto m = std::unique_ptr<TestMemory>(new TestMemory());
    m->gpu_ = &gpu;
    auto slab = gpu.AllocateSlab(kRegionBytes);
    EXPECT_TRUE(slab.ok()) << slab.status();
    if (!slab.ok()) return nullptr;
    m->slab_ = *std::move(slab);
    auto dmabuf = m->slab_->ExportDmabuf(0, kRegionBytes);
    if (!dmabuf.ok()) {
      // UNIMPLEMENTED: the driver or kernel has no DMA-BUF export; ferryd would try peer memory.
      EXPECT_EQ(dmabuf.status().code(), absl::StatusCode::kUnimplemented) << dmabuf.status();
      *skip = absl::StrCat("no DMA-BUF export of GPU memory: ", dmabuf.status().message());
      return nullptr;
    }
    auto region =
        fabric.RegisterDmabuf(m->slab_->data(), kRegionBytes, {dmabuf->fd, dmabuf->offset},
                              access | fabric::kDeviceMemory);
    ::close(dmabuf->fd);
    if (!region.ok() && region.status().code() == absl::StatusCode::kUnimplemented) {
      // EOPNOTSUPP: this NIC's kernel driver cannot import DMA-BUFs.
      *skip = absl::StrCat("the NIC cannot register DMA-BUFs: ", region.status().message());
      return nullptr;
    }
    EXPECT_TRUE(region.ok()) << region.status();
    if (!region.ok()) return nullptr;
    EXPECT_EQ((*region)->registration(), "ibv_reg_dmabuf_mr");
    m->region_ = *std::move(region);
    // Device memory starts as whatever cudaMalloc left there.
    EXPECT_TRUE(m->Put(0, std::vector<char>(kRegionBytes, 0)).ok());
    return m;
  }

  const char* kind() const { return gpu_ != nullptr ? "GPU" : "host"; }
  const fabric::MemoryRegion& region() const { return *region_; }
  fabric::RemoteSlice remote(uint64_t offset) const {
    return {region_->remote_address() + offset, region_->key()};
  }

  absl::Status Put(uint64_t offset, const std::vector<char>& bytes) {
    if (gpu_ == nullptr) {
      std::copy(bytes.begin(), bytes.end(), host_.begin() + offset);
      return absl::OkStatus();
    }
    return CopyAndWait(*gpu_, false, static_cast<char*>(slab_->data()) + offset, bytes.data(),
                       bytes.size());
  }
  absl::StatusOr<std::vector<char>> Get(uint64_t offset, uint64_t n) const {
    if (gpu_ == nullptr) {
      return std::vector<char>(host_.begin() + offset, host_.begin() + offset + n);
    }
    std::vector<char> out(n);
    absl::Status s =
        CopyAndWait(*gpu_, true, out.data(), static_cast<char*>(slab_->data()) + offset, n);
    if (!s.ok()) return s;
    return out;
  }

 private:
  TestMemory() = default;

  memory::GpuDevice* gpu_ = nullptr;
  std::vector<char> host_;
  std::unique_ptr<memory::DeviceSlab> slab_;
  std::unique_ptr<fabric::MemoryRegion> region_;  // last: deregistered before the memory goes
};

// Why there is no usable RDMA NIC here, or "".
std::string NoNicReason(std::unique_ptr<VerbsFabric>* initiator,
                        std::unique_ptr<VerbsFabric>* target) {
  auto a = VerbsFabric::Create(VerbsOptions{}, RdmaCoreApi());
  if (!a.ok()) return absl::StrCat("no usable RDMA NIC: ", a.status().ToString());
  auto b = VerbsFabric::Create(VerbsOptions{}, RdmaCoreApi());
  if (!b.ok()) return absl::StrCat("a second fabric on the NIC failed: ", b.status().ToString());
  *initiator = std::move(*a);
  *target = std::move(*b);
  return "";
}

class VerbsHardwareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::string> why = Missing();
    if (!why.empty()) {
      std::string reason = absl::StrJoin(why, "; ");
      std::printf("skipping: %s\n", reason.c_str());
      GTEST_SKIP() << reason;
    }
    auto ep = fabric::ConnectDirect(*initiator_, *target_);
    ASSERT_TRUE(ep.ok()) << ep.status();
    ep_ = *std::move(ep);
  }
  void TearDown() override {
    if (ep_) ep_->Close();
  }

  // What this test needs and this machine lacks, each with its reason.
  virtual std::vector<std::string> Missing() {
    std::string nic = NoNicReason(&initiator_, &target_);
    if (nic.empty()) return {};
    return {nic};
  }

  // WRITEs `n` bytes of a pattern from `src` into `dst` at kTargetOffset and READs them back
  // into `back`; then checks `back`, and `dst` with the bytes around the target, each through
  // its own access (the copy engine for GPU memory).
  void WriteAndReadBack(TestMemory& src, TestMemory& dst, TestMemory& back, uint64_t n,
                        uint32_t seed) {
    SCOPED_TRACE(
        absl::StrCat(src.kind(), " -> ", dst.kind(), " -> ", back.kind(), ", ", n, " bytes"));
    std::vector<char> pattern(n);
    FillPattern(pattern.data(), n, seed, 0);
    ASSERT_TRUE(src.Put(0, pattern).ok());
    ASSERT_TRUE(dst.Put(0, std::vector<char>(kTargetOffset + n + 1, 0)).ok());
    ASSERT_TRUE(back.Put(0, std::vector<char>(n, 0)).ok());

    fabric::CompletionWaiter wrote;
    absl::Status s =
        ep_->PostWrite({&src.region(), 0, n}, dst.remote(kTargetOffset), wrote.Callback());
    ASSERT_TRUE(s.ok()) << s;
    s = wrote.Wait();
    ASSERT_TRUE(s.ok()) << "WRITE: " << s;
    // The READ comes before the target is checked: a WRITE's completion does not promise that
    // the GPU already sees the bytes (the driver API has cuFlushGPUDirectRDMAWrites for that),
    // while a READ of the same memory after it does: PCIe read completions push earlier posted
    // writes ahead of them. NCCL flushes its GDR receives with a READ the same way.
    fabric::CompletionWaiter read;
    s = ep_->PostRead({&back.region(), 0, n}, dst.remote(kTargetOffset), read.Callback());
    ASSERT_TRUE(s.ok()) << s;
    s = read.Wait();
    ASSERT_TRUE(s.ok()) << "READ: " << s;

    auto got = back.Get(0, n);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(FirstMismatch(got->data(), n, seed, 0), n) << "READ returned wrong bytes";
    auto landed = dst.Get(kTargetOffset - 1, n + 2);
    ASSERT_TRUE(landed.ok()) << landed.status();
    EXPECT_EQ(FirstMismatch(landed->data() + 1, n, seed, 0), n) << "WRITE landed wrong bytes";
    EXPECT_EQ(landed->front(), 0) << "WRITE touched the byte before its target";
    EXPECT_EQ(landed->back(), 0) << "WRITE touched the byte after its target";
  }

  std::unique_ptr<VerbsFabric> initiator_, target_;
  std::shared_ptr<fabric::Endpoint> ep_;
};

constexpr uint32_t kLocalAccess = fabric::kLocal;
constexpr uint32_t kTargetAccess = fabric::kRemoteWrite | fabric::kRemoteRead;

TEST_F(VerbsHardwareTest, LoopbackWriteAndReadOnTheFirstActivePort) {
  auto src = TestMemory::Host(*initiator_, kLocalAccess);
  auto back = TestMemory::Host(*initiator_, kLocalAccess);
  auto dst = TestMemory::Host(*target_, kTargetAccess);
  ASSERT_TRUE(src && back && dst);
  uint32_t seed = 1;
  for (uint64_t n : kSizes) {
    WriteAndReadBack(*src, *dst, *back, n, seed++);
    if (HasFatalFailure()) return;
  }
}

// The CUDA GPU tests also need GPU 0, a CUDA build, and DMA-BUF support in driver and NIC.
class VerbsGpuHardwareTest : public VerbsHardwareTest {
 protected:
  std::vector<std::string> Missing() override {
    std::vector<std::string> why = VerbsHardwareTest::Missing();
    auto gpus = memory::CreateCudaGpus();
    if (!gpus.ok()) {
      why.push_back(gpus.status().code() == absl::StatusCode::kUnimplemented
                        ? absl::StrCat("built without CUDA: ", gpus.status().message())
                        : absl::StrCat("no CUDA GPU: ", gpus.status().message()));
    } else if (gpus->empty()) {
      why.push_back("no CUDA GPU: the CUDA driver sees no GPU");
    } else {
      gpus_ = std::move(*gpus);
    }
    return why;
  }

  // GPU memory on `fabric`, or a skip (with its reason) where DMA-BUF is not supported.
  std::unique_ptr<TestMemory> Gpu(VerbsFabric& fabric, uint32_t access) {
    std::string skip;
    auto m = TestMemory::Gpu(fabric, *gpus_[0], access, &skip);
    if (!skip.empty() && skip_.empty()) {
      skip_ = skip;
      std::printf("skipping: %s\n", skip.c_str());
    }
    return m;
  }

  std::vector<std::unique_ptr<memory::GpuDevice>> gpus_;
  std::string skip_;
};

TEST_F(VerbsGpuHardwareTest, DmabufWriteAndReadBetweenGpuAndHost) {
  // GPU source and READ destination, host target; then host source, GPU target.
  auto gpu_src = Gpu(*initiator_, kLocalAccess);
  auto gpu_back = Gpu(*initiator_, kLocalAccess);
  auto host_dst = TestMemory::Host(*target_, kTargetAccess);
  auto host_src = TestMemory::Host(*initiator_, kLocalAccess);
  auto host_back = TestMemory::Host(*initiator_, kLocalAccess);
  auto gpu_dst = Gpu(*target_, kTargetAccess);
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_TRUE(gpu_src && gpu_back && host_dst && host_src && host_back && gpu_dst);
  uint32_t seed = 100;
  for (uint64_t n : kSizes) {
    WriteAndReadBack(*gpu_src, *host_dst, *gpu_back, n, seed++);
    WriteAndReadBack(*host_src, *gpu_dst, *host_back, n, seed++);
    if (HasFatalFailure()) return;
  }
}

TEST_F(VerbsGpuHardwareTest, DmabufWriteAndReadGpuToGpu) {
  auto src = Gpu(*initiator_, kLocalAccess);
  auto back = Gpu(*initiator_, kLocalAccess);
  auto dst = Gpu(*target_, kTargetAccess);
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_TRUE(src && back && dst);
  uint32_t seed = 200;
  for (uint64_t n : kSizes) {
    WriteAndReadBack(*src, *dst, *back, n, seed++);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace ferry::verbs
