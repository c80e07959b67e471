#pragma once
// One copy on a GPU's copy engine, waited for: how MoveBlocks' verify reads GPU blocks, and
// how the GPU tests and their helper programs put bytes into device memory and read them
// back, never touching device memory with the CPU.

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "transport/memory/gpu_device.h"

namespace ferry::memory {

// Device -> host when `to_host`, else host -> device. The copy's own status, or why it could
// not be submitted.
inline absl::Status CopyAndWait(GpuDevice& gpu, bool to_host, void* dst, const void* src,
                                uint64_t n) {
  absl::Notification finished;
  absl::Status result;
  auto done = [&](absl::Status s) {
    result = std::move(s);
    finished.Notify();
  };
  absl::Status posted =
      to_host ? gpu.CopyToHost(dst, src, n, done) : gpu.CopyToDevice(dst, src, n, done);
  if (!posted.ok()) return posted;
  finished.WaitForNotification();
  return result;
}

}  // namespace ferry::memory
