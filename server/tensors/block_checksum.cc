#include "server/tensors/block_checksum.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/status_macros.h"
#include "server/buffers/guarded_touch.h"
#include "transport/memory/gpu_copy_wait.h"

namespace ferry::server {
namespace {

// GPU memory goes through the host this much at a time: a block of any size needs no more.
constexpr uint64_t kCopyPiece = 4 << 20;

}  // namespace

absl::StatusOr<uint32_t> BlockCrc32c(const Buffer& buffer, uint64_t offset, uint64_t length,
                                     GpuPools* gpus, std::vector<char>& scratch) {
  if (buffer.gpu() < 0) {
    // The client's own file may shrink under the read: that fails this block, not the agent.
    uint32_t crc = 0;
    RETURN_IF_ERROR(GuardedTouch(buffer, [&] { crc = Crc32c(buffer.data() + offset, length); }));
    return crc;
  }
  if (gpus == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer ", buffer.id(), " is on ", buffer.device(), ", which has no pool"));
  }
  memory::GpuDevice& gpu = gpus->device(buffer.gpu());
  scratch.resize(std::min(length, kCopyPiece));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < length;) {
    const uint64_t n = std::min(length - done, kCopyPiece);
    RETURN_IF_ERROR(memory::CopyAndWait(gpu, /*to_host=*/true, scratch.data(),
                                        buffer.data() + offset + done, n));
    crc = Crc32c(scratch.data(), n, crc);
    done += n;
  }
  return crc;
}

}  // namespace ferry::server
