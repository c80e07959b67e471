#pragma once
// One chunk of a staged WRITE, in named steps:
//
//   CopyOut (our GPU -> our bounce chunk)  ┐
//                                          ├─> PostWire (WRITE) -> WireDone -> ReportToPeer
//   TakeGrant (a chunk of the peer's)      ┘
//
// The two first steps run at once (the copy on the GPU's copy engine while we wait for a
// credit); whichever finishes last posts the WRITE. Without a staged side the step is
// skipped: the WRITE goes from the buffer itself, or to the peer's buffer (`direct`). When
// the peer is staged, it copies the chunk into its GPU and reports that; the op's progress
// then comes through StageEvents::OnCopied.

#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/staged_chunk.h"

namespace ferry::server {

class StagedWrite : public std::enable_shared_from_this<StagedWrite> {
 public:
  // Starts the chunk on the calling (sender's) thread, which TakeGrant may block until the
  // peer grants a chunk or the deadline.
  static void Start(StagedChunk chunk, ChunkDone done);

  StagedWrite(StagedChunk chunk, ChunkDone done)
      : c_(std::move(chunk)), done_(std::move(done)) {}

 private:
  void CopyOut();
  void TakeGrant();
  // One of the two first steps is in; the second posts the WRITE.
  void Arrive(const absl::Status& status);
  void PostWire();
  void WireDone(absl::Status status);
  void ReportToPeer();
  void Finish(uint64_t bytes, absl::Status status);

  StagedChunk c_;
  ChunkDone done_;
  absl::Mutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 2;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::optional<StageGrant> grant_;  // set before the last Arrive, read after it
};

}  // namespace ferry::server
