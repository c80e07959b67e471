#include "server/engine/staged_read.h"

#include <utility>

namespace ferry::server {

void StagedRead::Start(StagedChunk chunk, ChunkDone done) {
  auto r = std::make_shared<StagedRead>(std::move(chunk), std::move(done));
  // The peer's side staged: it copies the range out first. Else READ its buffer directly.
  r->c_.call ? r->Fetch() : r->PostWire(r->c_.direct);
}

void StagedRead::Fetch() {
  // `ready` runs on the call's reader thread. It holds this chunk, which holds the call;
  // the call is also held by the sender until it closes it, so this is never its last
  // reference (a call must not be destroyed on its own reader thread).
  c_.call->Fetch(c_.op->remote_offset + c_.offset, c_.length,
                 [self = shared_from_this()](absl::StatusOr<StageGrant> ready) {
                   if (!ready.ok()) return self->Finish(0, ready.status());
                   self->grant_ = GrantLease(self->c_.call, ready->grant);
                   self->PostWire({ready->address, ready->key});
                 });
}

void StagedRead::PostWire(const fabric::RemoteSlice& remote) {
  absl::Status posted = c_.endpoint->PostRead(
      c_.local_slice(), remote,
      [self = shared_from_this()](absl::Status s) { self->Landed(std::move(s)); });
  if (!posted.ok()) Landed(posted);
}

void StagedRead::Landed(absl::Status status) {
  // The bytes are ours (or will not come): the peer may reuse its chunk.
  grant_ = GrantLease();
  if (!status.ok() || !c_.bounce) {
    const uint64_t bytes = status.ok() ? c_.length : 0;
    return Finish(bytes, std::move(status));
  }
  CopyIn();
}

void StagedRead::CopyIn() {
  absl::Status s = c_.gpu->CopyToDevice(c_.gpu_bytes(), c_.bounce.data(), c_.length,
                                        [self = shared_from_this()](absl::Status s) {
                                          self->Finish(s.ok() ? self->c_.length : 0, s);
                                        });
  if (!s.ok()) Finish(0, s);
}

void StagedRead::Finish(uint64_t bytes, absl::Status status) {
  // Give back what the chunk holds before the op may settle (and accounting be read), `done_`
  // too: it holds the sender (and so the buffers), and this object may outlive the chunk in
  // a closure another thread has yet to drop (StagedWrite::Finish says why that matters).
  // The call stays: dropping it here could destroy it on its own reader thread (Fetch).
  grant_ = GrantLease();
  c_.bounce = ChunkLease();
  ChunkDone done = std::exchange(done_, nullptr);
  std::move(done)(bytes, std::move(status));
}

}  // namespace ferry::server
