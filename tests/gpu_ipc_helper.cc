// The second process of gpu_memory_test's CUDA IPC check: maps the parent's slab through
// libferry's OpenCudaIpc, as an application would, checks the pattern the parent wrote and
// writes its own; then imports the range as the agent does for RegisterMemory
// (GpuDevice::Import) and checks that it sees those bytes. CUDA cannot be used in a child
// forked after CUDA started, hence a program.
//
//   gpu_ipc_helper <handle hex> <slab offset> <length> <pci> <seed to check> <seed to write>
// Exits 0 when all went well; otherwise prints why and exits 1.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "client/gpu_mapping.h"
#include "transport/memory/gpu_copy_wait.h"
#include "tests/gpu_pattern.h"
#include "transport/memory/gpu_device.h"

namespace {

using ferry::memory::CopyAndWait;

int Fail(const std::string& why) {
  std::fprintf(stderr, "gpu_ipc_helper: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7)
    return Fail("usage: gpu_ipc_helper HANDLE_HEX OFFSET LENGTH PCI SEED_CHECK SEED_WRITE");
  std::string handle = absl::HexStringToBytes(argv[1]);
  uint64_t offset = 0, length = 0;
  uint32_t check = 0, write = 0;
  if (!absl::SimpleAtoi(argv[2], &offset) || !absl::SimpleAtoi(argv[3], &length) ||
      !absl::SimpleAtoi(argv[5], &check) || !absl::SimpleAtoi(argv[6], &write)) {
    return Fail("bad number in arguments");
  }
  auto device = ferry::CudaDeviceByPci(argv[4]);
  if (!device.ok()) return Fail(device.status().ToString());
  auto gpus = ferry::memory::CreateCudaGpus();
  if (!gpus.ok()) return Fail(gpus.status().ToString());
  if (static_cast<size_t>(*device) >= gpus->size()) return Fail("no such GPU");
  ferry::memory::GpuDevice& gpu = *(*gpus)[*device];

  auto mapped = ferry::OpenCudaIpc(handle, offset, *device);
  if (!mapped.ok()) return Fail(mapped.status().ToString());
  // A second open of the same handle shares the mapping (one cudaIpcOpenMemHandle).
  auto again = ferry::OpenCudaIpc(handle, offset + 4096, *device);
  if (!again.ok()) return Fail(again.status().ToString());
  if (static_cast<char*>(*again) - static_cast<char*>(*mapped) != 4096) {
    return Fail("a second OpenCudaIpc of the same handle did not share the mapping");
  }
  if (absl::Status s = ferry::CloseCudaIpc(handle); !s.ok()) return Fail(s.ToString());

  std::vector<char> host(length);
  if (absl::Status s = CopyAndWait(gpu, true, host.data(), *mapped, length); !s.ok()) {
    return Fail(s.ToString());
  }
  uint64_t bad = ferry::testing::FirstMismatch(host.data(), length, check, offset);
  if (bad != length) return Fail("the parent's pattern differs at byte " + std::to_string(bad));
  ferry::testing::FillPattern(host.data(), length, write, offset);
  if (absl::Status s = CopyAndWait(gpu, false, *mapped, host.data(), length); !s.ok()) {
    return Fail(s.ToString());
  }
  if (absl::Status s = ferry::CloseCudaIpc(handle); !s.ok()) return Fail(s.ToString());
  if (ferry::CloseCudaIpc(handle).code() != absl::StatusCode::kNotFound) {
    return Fail("closing a handle no longer open did not say NOT_FOUND");
  }

  // The agent's way in (RegisterMemory by IPC handle): GpuDevice::Import of the same range
  // sees the bytes just written, exports the handle again, and refuses a range past the end
  // of the allocation the handle names.
  ferry::memory::GpuImport what;
  what.kind = "cuda_ipc";
  what.handle = handle;
  what.offset = offset;
  what.length = length;
  {
    auto imported = gpu.Import(what);
    if (!imported.ok()) return Fail(imported.status().ToString());
    if (absl::Status s = CopyAndWait(gpu, true, host.data(), (*imported)->data(), length);
        !s.ok()) {
      return Fail(s.ToString());
    }
    bad = ferry::testing::FirstMismatch(host.data(), length, write, offset);
    if (bad != length) return Fail("Import: the bytes differ at byte " + std::to_string(bad));
    auto e = (*imported)->Export(0, length);
    if (!e.ok() || e->handle != handle || e->offset != offset) {
      return Fail("Import: the imported range does not export the same handle and offset");
    }
  }
  what.length = uint64_t{1} << 40;
  if (gpu.Import(what).status().code() != absl::StatusCode::kOutOfRange) {
    return Fail("Import of a range past the allocation was not refused with OUT_OF_RANGE");
  }
  std::printf(
      "gpu_ipc_helper: mapped %llu bytes at slab offset %llu on GPU %d, checked and wrote\n",
      static_cast<unsigned long long>(length), static_cast<unsigned long long>(offset), *device);
  return 0;
}
