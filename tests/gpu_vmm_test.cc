// CudaGpu::Import of a CUDA VMM allocation by its shareable fd (label `gpu`): what PyTorch's
// expandable segments hand out. The test allocates with cuMemCreate (driver entry points
// looked up through the runtime, as the backend does), exports a POSIX fd, imports a range of
// it (the handle mapped whole: with the allocation's size, or running to its end) and checks
// that the imported slab reads the allocation's bytes; a range short of the end without the
// size, a wrong size, a range past the end, a closed fd and another GPU's memory are refused.
// Skips, saying why, without a GPU or in a build without CUDA.

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "transport/memory/gpu_copy_wait.h"
#include "tests/gpu_pattern.h"
#include "transport/memory/gpu_device.h"

#ifdef FERRY_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#endif

namespace ferry::memory {
namespace {

#ifdef FERRY_WITH_CUDA

template <typename Fn>
Fn Entry(const char* symbol) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(p);
}

// One VMM allocation of `bytes` on GPU 0, mapped here and exported as a POSIX fd.
struct VmmAllocation {
  PFN_cuMemCreate_v10020 create = Entry<PFN_cuMemCreate_v10020>("cuMemCreate");
  PFN_cuMemExportToShareableHandle_v10020 export_fd =
      Entry<PFN_cuMemExportToShareableHandle_v10020>("cuMemExportToShareableHandle");
  PFN_cuMemAddressReserve_v10020 reserve =
      Entry<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve");
  PFN_cuMemMap_v10020 map = Entry<PFN_cuMemMap_v10020>("cuMemMap");
  PFN_cuMemSetAccess_v10020 access = Entry<PFN_cuMemSetAccess_v10020>("cuMemSetAccess");
  PFN_cuMemUnmap_v10020 unmap = Entry<PFN_cuMemUnmap_v10020>("cuMemUnmap");
  PFN_cuMemAddressFree_v10020 address_free =
      Entry<PFN_cuMemAddressFree_v10020>("cuMemAddressFree");
  PFN_cuMemRelease_v10020 release = Entry<PFN_cuMemRelease_v10020>("cuMemRelease");

  std::string Make(uint64_t n) {
    if (!create || !export_fd || !reserve || !map || !access || !unmap || !address_free ||
        !release) {
      return "the driver lacks the VMM entry points";
    }
    bytes = n;
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (CUresult r = create(&handle, bytes, &prop, 0); r != CUDA_SUCCESS) {
      return "cuMemCreate: CUresult " + std::to_string(r);
    }
    if (CUresult r = export_fd(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        r != CUDA_SUCCESS) {
      return "cuMemExportToShareableHandle: CUresult " + std::to_string(r);
    }
    if (reserve(&ptr, bytes, 0, 0, 0) != CUDA_SUCCESS ||
        map(ptr, bytes, 0, handle, 0) != CUDA_SUCCESS) {
      return "cuMemAddressReserve/cuMemMap failed";
    }
    mapped = true;
    CUmemAccessDesc desc = {};
    desc.location = prop.location;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (access(ptr, bytes, &desc, 1) != CUDA_SUCCESS) return "cuMemSetAccess failed";
    return "";
  }
  ~VmmAllocation() {
    if (mapped) unmap(ptr, bytes);
    if (ptr != 0) address_free(ptr, bytes);
    if (handle != 0) release(handle);
    if (fd >= 0) close(fd);
  }
  uint64_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
  int fd = -1;
  CUdeviceptr ptr = 0;
  bool mapped = false;
};

TEST(GpuVmmImportTest, ARangeOfAVmmAllocationImportsByFdAndReadsItsBytes) {
  auto gpus = CreateCudaGpus();
  if (!gpus.ok() || gpus->empty()) {
    std::string why =
        gpus.ok() ? "the CUDA driver sees no GPU" : std::string(gpus.status().message());
    std::printf("skipping: no CUDA GPU: %s\n", why.c_str());
    GTEST_SKIP() << "no CUDA GPU: " << why;
  }
  GpuDevice& gpu = *(*gpus)[0];
  constexpr uint64_t kBytes = 64 << 20, kOffset = 3 << 20, kLength = 17 << 20;
  VmmAllocation vmm;
  const std::string why = vmm.Make(kBytes);
  ASSERT_EQ(why, "");
  std::vector<char> pattern(kBytes), back(kLength);
  ferry::testing::FillPattern(pattern.data(), kBytes, 5, 0);
  ASSERT_TRUE(ferry::memory::CopyAndWait(gpu, false, reinterpret_cast<void*>(vmm.ptr),
                                          pattern.data(), kBytes)
                  .ok());

  // The handle maps whole (the driver refuses a shorter mapping), so the range needs the
  // allocation's size, or to run to its end.
  auto slab = gpu.Import({.kind = "fd", .fd = vmm.fd, .offset = kOffset, .length = kLength,
                          .allocation_size = kBytes});
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_EQ((*slab)->size(), kLength);
  ASSERT_TRUE(ferry::memory::CopyAndWait(gpu, true, back.data(), (*slab)->data(), kLength).ok());
  EXPECT_EQ(ferry::testing::FirstMismatch(back.data(), kLength, 5, kOffset), kLength);
  // Not re-exported: the client maps it by its own fd.
  EXPECT_FALSE((*slab)->Export(0, kLength).ok());

  auto tail =
      gpu.Import({.kind = "fd", .fd = vmm.fd, .offset = kOffset, .length = kBytes - kOffset});
  ASSERT_TRUE(tail.ok()) << tail.status();
  ASSERT_TRUE(ferry::memory::CopyAndWait(gpu, true, back.data(), (*tail)->data(), kLength).ok());
  EXPECT_EQ(ferry::testing::FirstMismatch(back.data(), kLength, 5, kOffset), kLength);
  auto short_of_end =
      gpu.Import({.kind = "fd", .fd = vmm.fd, .offset = kOffset, .length = kLength});
  EXPECT_EQ(short_of_end.status().code(), absl::StatusCode::kOutOfRange) << short_of_end.status();
  EXPECT_NE(std::string(short_of_end.status().message()).find("allocation_size"),
            std::string::npos)
      << short_of_end.status();
  std::printf("a range short of the allocation's end, without its size: %s\n",
              short_of_end.status().ToString().c_str());
  for (uint64_t wrong : {kBytes / 2, kBytes * 2}) {
    auto r = gpu.Import({.kind = "fd", .fd = vmm.fd, .offset = kOffset, .length = kLength,
                         .allocation_size = wrong});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << wrong << ": " << r.status();
  }
  auto past = gpu.Import({.kind = "fd", .fd = vmm.fd, .offset = kOffset, .length = kBytes});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange) << past.status();
  auto closed = gpu.Import({.kind = "fd", .fd = 1 << 20, .offset = 0, .length = kLength});
  EXPECT_FALSE(closed.ok());
  EXPECT_NE(std::string(closed.status().message()).find("cuMemImportFromShareableHandle"),
            std::string::npos)
      << closed.status();
  if (gpus->size() > 1) {
    auto other = (*gpus)[1]->Import({.kind = "fd", .fd = vmm.fd, .offset = 0, .length = kLength});
    EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument) << other.status();
  }
}

#else

TEST(GpuVmmImportTest, ARangeOfAVmmAllocationImportsByFdAndReadsItsBytes) {
  std::printf("skipping: built without CUDA (FERRY_CUDA=OFF or no nvcc)\n");
  GTEST_SKIP() << "built without CUDA";
}

#endif

}  // namespace
}  // namespace ferry::memory
