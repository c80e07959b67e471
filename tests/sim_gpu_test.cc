// The simulated GPU is as strict as a real one about who touches device memory: the agent's
// CPU faults on a device address, copies go through the copy engine and must lie inside one
// live allocation (else cudaErrorInvalidValue, nothing touched), a client maps the export,
// a client's allocation imports only mapped whole (as cuMemMap maps a VMM handle), and a NIC
// reaches the memory only through the peer-memory table.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakes/gpu_copies.h"
#include "tests/gpu_pattern.h"
#include "transport/memory/device_ranges.h"
#include "transport/memory/gpu_device.h"
#include "transport/memory/peer_memory.h"
#include "transport/memory/vmm_mapping.h"

namespace ferry::memory {
namespace {

using fake::ReadGpu;
using fake::WriteGpu;
using ferry::testing::FillPattern;
using ferry::testing::FirstMismatch;

constexpr uint64_t kSlab = 1 << 20;

class SimGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto slab = gpu_->AllocateSlab(kSlab);
    ASSERT_TRUE(slab.ok()) << slab.status();
    slab_ = std::move(*slab);
    device_ = static_cast<char*>(slab_->data());
  }

  std::unique_ptr<GpuDevice> gpu_ = CreateSimGpu(0, "0000:3b:00.0", 0);
  std::unique_ptr<DeviceSlab> slab_;
  char* device_ = nullptr;
};

using SimGpuDeathTest = SimGpuTest;

TEST_F(SimGpuDeathTest, TheCpuFaultsOnDeviceMemory) {
  // The copy thread runs in the parent: re-execute for the death test rather than fork it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_FALSE(gpu_->host_addressable());
  volatile char* p = device_;
  // The default action first: under ASan (make test-asan) its SEGV handler would report the
  // fault and exit 1 instead of letting the signal kill the child.
  EXPECT_EXIT((signal(SIGSEGV, SIG_DFL), (void)p[100]), ::testing::KilledBySignal(SIGSEGV), "");
  EXPECT_EXIT((signal(SIGSEGV, SIG_DFL), p[kSlab - 1] = 1), ::testing::KilledBySignal(SIGSEGV),
              "");
}

TEST_F(SimGpuTest, CopiesThroughTheEngineRoundTrip) {
  std::vector<char> in(64 << 10), out(64 << 10, 0);
  FillPattern(in.data(), in.size(), 7, 0);
  ASSERT_TRUE(WriteGpu(*gpu_, device_ + 4096 + 3, in.data(), in.size()).ok());
  ASSERT_TRUE(ReadGpu(*gpu_, out.data(), device_ + 4096 + 3, out.size()).ok());
  EXPECT_EQ(FirstMismatch(out.data(), out.size(), 7, 0), out.size());
  // The last byte of the slab is inside it; a zero-length copy at its end is too.
  char last = 'z', back = 0;
  ASSERT_TRUE(WriteGpu(*gpu_, device_ + kSlab - 1, &last, 1).ok());
  ASSERT_TRUE(ReadGpu(*gpu_, &back, device_ + kSlab - 1, 1).ok());
  EXPECT_EQ(back, 'z');
  EXPECT_TRUE(ReadGpu(*gpu_, &back, device_ + kSlab, 0).ok());
}

TEST_F(SimGpuTest, CopiesOutsideOneLiveSlabFailAndTouchNothing) {
  std::vector<char> host(2 * kSlab, 'h');
  // Each copy must be refused now, and its `done` never run (checked at the end, when any
  // copy wrongly accepted would have run: the engine runs copies in order).
  auto ran = std::make_shared<std::atomic<int>>(0);
  auto refused = [&](void* device, uint64_t n) {
    absl::Status s = gpu_->CopyToHost(host.data(), device, n, [ran](absl::Status) { ++*ran; });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("cudaErrorInvalidValue"), std::string::npos) << s;
    s = gpu_->CopyToDevice(device, host.data(), n, [ran](absl::Status) { ++*ran; });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  };
  refused(device_ + kSlab - 10, 11);  // runs past the end
  refused(device_ - 1, 2);            // starts before it
  refused(device_ + kSlab, 1);        // just after it
  refused(host.data(), 16);           // host memory is no device address
  refused(device_, ~uint64_t{0});     // would wrap

  // Two slabs are two allocations, even where they happen to be adjacent.
  auto second = gpu_->AllocateSlab(kSlab);
  ASSERT_TRUE(second.ok());
  char* other = static_cast<char*>((*second)->data());
  refused(other < device_ ? other + kSlab - 8 : device_ + kSlab - 8, 16);
  // A "host" pointer that is device memory is refused too (the copy thread would fault).
  absl::Status s = gpu_->CopyToDevice(device_, other, 16, [ran](absl::Status) { ++*ran; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // A freed slab's range is no allocation any more.
  second->reset();
  refused(other, 16);

  char sync = 0;  // a good copy behind the refused ones: when it is done, all would have run
  ASSERT_TRUE(ReadGpu(*gpu_, &sync, device_, 1).ok());
  EXPECT_EQ(*ran, 0) << "a refused copy's `done` ran";
  EXPECT_EQ(std::count(host.begin(), host.end(), 'h'), static_cast<long>(host.size()));
}

TEST_F(SimGpuTest, AClientMapsTheExportAndSeesTheDeviceBytes) {
  auto e = slab_->Export(8192, 4096);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->kind, "shm");
  std::vector<char> in(4096);
  FillPattern(in.data(), in.size(), 3, 0);
  ASSERT_TRUE(WriteGpu(*gpu_, device_ + 8192, in.data(), in.size()).ok());
  // What a client does (client/ferry_client.cc Buffer::Map): open the path, map it RW.
  int fd = open(e->path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << e->path;
  void* p = mmap(nullptr, e->length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                 static_cast<off_t>(e->offset));
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(FirstMismatch(p, 4096, 3, 0), 4096u);
  std::memset(p, 'c', 16);  // the client writes; the engine sees it
  char back[16];
  ASSERT_TRUE(ReadGpu(*gpu_, back, device_ + 8192, 16).ok());
  EXPECT_EQ(std::string(back, 16), std::string(16, 'c'));
  munmap(p, e->length);
}

// The mapping rule both backends share: a handle maps whole, so the size mapped is the
// allocation's, given or reached by the range's end.
TEST(VmmMappingTest, AHandleMapsWholeFromTheGivenSizeOrTheRangesRoundedEnd) {
  constexpr uint64_t kG = 2 << 20;
  EXPECT_EQ(*VmmMappingSize({.kind = "fd", .offset = 3 << 20, .length = 17 << 20}, kG), 20u << 20);
  EXPECT_EQ(*VmmMappingSize({.kind = "fd", .offset = 0, .length = 1}, kG), kG);
  EXPECT_EQ(*VmmMappingSize(
                {.kind = "fd", .offset = 3 << 20, .length = 17 << 20, .allocation_size = 64 << 20},
                kG),
            64u << 20);
  auto past = VmmMappingSize(
      {.kind = "fd", .offset = 3 << 20, .length = 62 << 20, .allocation_size = 64 << 20}, kG);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(past.status().message(), ::testing::HasSubstr("past allocation_size"));
  auto odd = VmmMappingSize({.kind = "fd", .length = 1, .allocation_size = 3 << 20}, kG);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.status().message(), ::testing::HasSubstr("allocation_size"));
  EXPECT_EQ(VmmMappingSize({.kind = "fd", .offset = UINT64_MAX - 4, .length = 4}, kG)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(VmmMappingSize({.kind = "fd", .offset = 4, .length = UINT64_MAX - 2}, kG)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
}

// A client's simulated allocation imports as a VMM handle does on an H200: mapped whole, so a
// range short of its end needs the allocation's size, and a wrong size is refused.
TEST(SimGpuImportTest, ARangeImportsOnlyWithTheWholeAllocationMapped) {
  auto gpu = CreateSimGpu(0, "0000:3b:00.0", 0);
  constexpr uint64_t kBytes = 64 << 20, kOffset = 3 << 20, kLength = 17 << 20;
  UniqueFd fd(memfd_create("client-vmm", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(ftruncate(fd.get(), kBytes), 0);
  void* client = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(client, MAP_FAILED);
  FillPattern(client, kBytes, 5, 0);

  auto slab = gpu->Import({.kind = "fd",
                           .fd = fd.get(),
                           .offset = kOffset,
                           .length = kLength,
                           .allocation_size = kBytes});
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_EQ((*slab)->size(), kLength);
  std::vector<char> back(kLength);
  ASSERT_TRUE(ReadGpu(*gpu, back.data(), (*slab)->data(), kLength).ok());
  EXPECT_EQ(FirstMismatch(back.data(), kLength, 5, kOffset), kLength);
  // Running to the allocation's end needs no size.
  auto tail =
      gpu->Import({.kind = "fd", .fd = fd.get(), .offset = kOffset, .length = kBytes - kOffset});
  EXPECT_TRUE(tail.ok()) << tail.status();

  // Short of the end without the size: what the driver answers to a partial mapping.
  auto short_of_end =
      gpu->Import({.kind = "fd", .fd = fd.get(), .offset = kOffset, .length = kLength});
  EXPECT_EQ(short_of_end.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(short_of_end.status().message(), ::testing::HasSubstr("CUDA_ERROR_NOT_SUPPORTED"));
  EXPECT_THAT(short_of_end.status().message(), ::testing::HasSubstr("give allocation_size"));
  for (uint64_t wrong : {kBytes / 2, kBytes * 2}) {
    auto r = gpu->Import({.kind = "fd", .fd = fd.get(), .offset = kOffset, .length = kLength,
                          .allocation_size = wrong});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << wrong;
    EXPECT_THAT(r.status().message(), ::testing::HasSubstr("allocation_size")) << wrong;
  }
  // No VMM allocation is a size cuMemCreate would not make.
  UniqueFd odd(memfd_create("client-odd", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(odd.get(), 3 << 19), 0);
  auto r = gpu->Import({.kind = "fd", .fd = odd.get(), .offset = 0, .length = 3 << 19});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("not a simulated VMM allocation"));
  munmap(client, kBytes);
}

TEST_F(SimGpuTest, PeerMemoryMapsLiveSlabsAndPinsWhatItHandsOut) {
  EXPECT_EQ(PeerMemory().Find(device_ + kSlab - 8, 16), nullptr) << "runs past the slab";
  std::shared_ptr<char> pages = PeerMemory().Find(device_ + 100, 4096);
  ASSERT_NE(pages, nullptr);
  std::memcpy(pages.get(), "through the NIC", 15);
  char back[15];
  ASSERT_TRUE(ReadGpu(*gpu_, back, device_ + 100, 15).ok());
  EXPECT_EQ(std::string(back, 15), "through the NIC");
  // Freeing the slab forgets its range; pages already pinned stay usable.
  void* freed = device_;
  slab_.reset();
  EXPECT_EQ(PeerMemory().Find(freed, 1), nullptr);
  EXPECT_EQ(std::string(pages.get(), 15), "through the NIC");
}

// A copy in flight keeps its memory mapped though the slab is freed meanwhile (cudaFree
// waits for the device's outstanding work); the copy engine never touches unmapped memory.
TEST(SimGpuCopyTest, AFreedSlabOutlivesItsCopiesInFlight) {
  auto gpu = CreateSimGpu(1, "", 64 << 20);  // 64 MiB/s: a 4 MiB copy takes ~60 ms
  auto slab = gpu->AllocateSlab(4 << 20);
  ASSERT_TRUE(slab.ok());
  std::vector<char> host(4 << 20, 'x');
  absl::Notification done;
  absl::Status first, second = absl::UnknownError("never ran");
  char* device = static_cast<char*>((*slab)->data());
  // The second copy waits behind the first, so it runs after the slab is gone.
  ASSERT_TRUE(
      gpu->CopyToDevice(device, host.data(), host.size(), [&](absl::Status s) { first = s; }).ok());
  ASSERT_TRUE(gpu->CopyToHost(host.data(), device + 1, 4096,
                              [&](absl::Status s) {
                                second = s;
                                done.Notify();
                              })
                  .ok());
  slab->reset();
  done.WaitForNotification();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(second.ok()) << second;
}

TEST(DeviceRangesTest, OverlapsAreRefusedAndLookupsMustFitOneRange) {
  DeviceRanges ranges;
  auto bytes = std::shared_ptr<char>(new char[300], std::default_delete<char[]>());
  char* base = reinterpret_cast<char*>(0x10000);
  ASSERT_TRUE(ranges.Add(base, 100, bytes).ok());
  ASSERT_TRUE(ranges.Add(base + 100, 100, std::shared_ptr<char>(bytes, bytes.get() + 100)).ok());
  EXPECT_EQ(ranges.Add(base + 50, 10, bytes).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ranges.Add(base - 10, 11, bytes).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ranges.Add(base + 199, 5, bytes).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ranges.Add(base + 300, 0, bytes).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ranges.Add(base + 300, ~uint64_t{0}, bytes).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ranges.Find(base + 10, 90).get(), bytes.get() + 10);
  EXPECT_EQ(ranges.Find(base + 150, 50).get(), bytes.get() + 150);
  EXPECT_EQ(ranges.Find(base + 90, 20), nullptr) << "spans two ranges";
  EXPECT_EQ(ranges.Find(base - 1, 1), nullptr);
  EXPECT_EQ(ranges.Find(base + 200, 1), nullptr);
  EXPECT_EQ(ranges.Find(base + 10, ~uint64_t{0}), nullptr);
  ranges.Remove(base);
  EXPECT_EQ(ranges.Find(base, 1), nullptr);
  EXPECT_NE(ranges.Find(base + 100, 1), nullptr);
}

}  // namespace
}  // namespace ferry::memory
