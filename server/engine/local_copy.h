#pragma once
// Ops whose two buffers are both on this node (the peer they name is this node): the agent
// copies the bytes itself, with no fabric and no loopback connection. Host <-> host by
// memcpy (under a FaultGuard where a client could shrink its file: GuardedTouch); host <->
// GPU by the GPU's copy engine (CopyToDevice / CopyToHost); GPU <-> GPU by the destination
// GPU's stream (CopyFromDevice: one device's copy engine, or peer to peer). Each op goes in
// slices, so a cancel, a deadline or the agent stopping ends a long copy between two of
// them; the op is then left to whoever settled it.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/buffers/gpu_pools.h"
#include "server/engine/transfer.h"

namespace ferry::server {

class LocalCopier {
 public:
  // Settles op `index` of the transfer with its copy's outcome (provider "local").
  using Settle = std::function<void(size_t index, const absl::Status& status)>;
  // Bytes per slice: a cancel waits at most one slice's copy (~1 ms for host memory here).
  static constexpr uint64_t kSliceBytes = 8 << 20;
  // GPU slices queued on a stream at once: the next is queued while one runs.
  static constexpr int kGpuSlicesInFlight = 4;
  // Host bytes from which two threads copy (an op's two halves, or a batch's two halves):
  // one core's streaming copy reaches ~0.85 of one large memcpy here, two reach 1.3 of it.
  static constexpr uint64_t kTwoThreadBytes = 16 << 20;

  // How `op` (whose `here` is set) is copied, in the words of its legs: "memcpy", "copy
  // engine", "P2P", "peer copy via host"; or why it cannot be (FAILED_PRECONDITION: a GPU
  // buffer with no GPU device here, or a client's unsealed file beside GPU memory, which a
  // copy engine would fault on when the client shrinks it).
  static absl::StatusOr<std::string> EngineFor(const PlannedOp& op, GpuPools* gpus);
  // Host memory on both sides, `bytes` in all: small enough to copy on the thread that
  // posts the transfer rather than hand it to a thread of its own.
  static bool CopiesInline(const PlannedBatch& ops, const std::vector<size_t>& local);

  LocalCopier(std::shared_ptr<Transfer> transfer, PlannedOps planned, std::vector<size_t> ops,
              GpuPools* gpus, Settle settle);
  LocalCopier(const LocalCopier&) = delete;
  LocalCopier& operator=(const LocalCopier&) = delete;

  // Copies each op and settles it: in order, or a large host batch in two halves at once.
  void Run();

 private:
  // Ops `first`..`last` - 1 of ops_, in order; `split`: a large host op in two halves.
  void RunOps(size_t first, size_t last, bool split);
  // One op, slice by slice; CANCELLED when the transfer ended meanwhile.
  absl::Status Copy(const PlannedOp& op, bool split);
  absl::Status CopyHost(const Buffer& src, uint64_t src_offset, const Buffer& dst,
                        uint64_t dst_offset, uint64_t length);
  absl::Status CopyGpu(const Buffer& src, uint64_t src_offset, const Buffer& dst,
                       uint64_t dst_offset, uint64_t length);
  bool Ended() const { return transfer_->all_settled(); }

  const std::shared_ptr<Transfer> transfer_;
  const PlannedOps planned_;
  const std::vector<size_t> ops_;
  GpuPools* const gpus_;
  const Settle settle_;
};

}  // namespace ferry::server
