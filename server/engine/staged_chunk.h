#pragma once
// One chunk of a staged op, as the StageSender hands it to its pipeline (StagedWrite or
// StagedRead): every resource it needs is decided and held before it starts.

#include <cstdint>
#include <memory>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/buffers/bounce_pools.h"
#include "server/engine/transfer.h"
#include "server/peers/stage_call.h"
#include "transport/fabric.h"
#include "transport/memory/gpu_device.h"

namespace ferry::server {

struct StagedChunk {
  fabric::Endpoint* endpoint = nullptr;  // to the peer; lives as long as the transfer's sender
  fabric::RailId rail;                   // ours: which registration the wire uses
  const PlannedOp* op = nullptr;         // held by the sender's PlannedOps
  uint64_t offset = 0;                   // of the chunk within the op
  uint64_t length = 0;
  // Our side staged: our GPU and the bounce chunk its bytes pass through.
  memory::GpuDevice* gpu = nullptr;
  ChunkLease bounce;
  // The peer's side staged: its Stage call. Otherwise `direct` is where the wire goes.
  std::shared_ptr<StageCall> call;
  fabric::RemoteSlice direct;
  uint64_t token = 0;  // the op, echoed in the peer's copy reports
  absl::Time deadline;

  char* gpu_bytes() const { return op->local->data() + op->local_offset + offset; }
  // Our side of the wire: the bounce chunk, or the buffer itself.
  fabric::LocalSlice local_slice() const {
    if (bounce) return {bounce.region(rail), 0, length};
    return {op->local->region(rail), op->local_offset + offset, length};
  }
};

// Runs at most once per chunk with the bytes it moved, or why it failed, after the chunk
// gave back what it held. It does not run for a WRITE chunk the peer copies in: that one
// completes when the peer reports the copy (StageEvents::OnCopied).
using ChunkDone = absl::AnyInvocable<void(uint64_t bytes, absl::Status status) &&>;

}  // namespace ferry::server
