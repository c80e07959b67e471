#pragma once
// One chunk of a staged READ, in named steps:
//
//   [Fetch: the peer copies the range out of its GPU into a chunk it grants us]
//     -> PostWire (READ into our bounce chunk, or into the buffer itself)
//     -> Landed -> [CopyIn: our bounce chunk -> our GPU] -> Finish
//
// Fetch runs only when the peer's side is staged (else the READ goes to its buffer,
// `direct`), CopyIn only when ours is. The peer's chunk is held as a GrantLease from the
// grant to the end of the READ.

#include <memory>

#include "server/engine/staged_chunk.h"

namespace ferry::server {

class StagedRead : public std::enable_shared_from_this<StagedRead> {
 public:
  // Starts the chunk; it goes on on the call's and the fabric's threads.
  static void Start(StagedChunk chunk, ChunkDone done);

  StagedRead(StagedChunk chunk, ChunkDone done) : c_(std::move(chunk)), done_(std::move(done)) {}

 private:
  void Fetch();
  void PostWire(const fabric::RemoteSlice& remote);
  void Landed(absl::Status status);
  void CopyIn();
  void Finish(uint64_t bytes, absl::Status status);

  StagedChunk c_;
  ChunkDone done_;
  GrantLease grant_;  // the peer's chunk, while we READ it
};

}  // namespace ferry::server
