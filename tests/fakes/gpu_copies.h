#pragma once
// How a test puts bytes into GPU memory and reads them back: through the GPU's copy engine,
// waiting for each copy, since the CPU cannot touch device memory (a real GPU's, or a
// simulated one's: transport/memory/sim_gpu.cc maps it PROT_NONE, so a memcpy on it faults).

#include <cstdint>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "transport/memory/gpu_device.h"

namespace ferry::fake {

// Posts one copy with `post` and waits for it: the error that refused it, or how it ended.
inline absl::Status WaitForCopy(absl::FunctionRef<absl::Status(memory::CopyDone)> post) {
  absl::Notification done;
  absl::Status result;
  absl::Status posted = post([&](absl::Status s) {
    result = std::move(s);
    done.Notify();
  });
  if (!posted.ok()) return posted;
  done.WaitForNotification();
  return result;
}

inline absl::Status WriteGpu(memory::GpuDevice& gpu, void* device, const void* host, uint64_t n) {
  return WaitForCopy(
      [&](memory::CopyDone done) { return gpu.CopyToDevice(device, host, n, std::move(done)); });
}

inline absl::Status ReadGpu(memory::GpuDevice& gpu, void* host, const void* device, uint64_t n) {
  return WaitForCopy(
      [&](memory::CopyDone done) { return gpu.CopyToHost(host, device, n, std::move(done)); });
}

}  // namespace ferry::fake
