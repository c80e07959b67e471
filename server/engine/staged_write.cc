#include "server/engine/staged_write.h"

#include <utility>

namespace ferry::server {

void StagedWrite::Start(StagedChunk chunk, ChunkDone done) {
  auto w = std::make_shared<StagedWrite>(std::move(chunk), std::move(done));
  // Ours first: its copy-out then runs while we wait for the peer's grant, so a chunk is
  // ready to go on the wire the moment a credit comes back.
  if (w->c_.bounce) {
    w->CopyOut();
  } else {
    w->Arrive(absl::OkStatus());
  }
  if (w->c_.call) {
    w->TakeGrant();
  } else {
    w->Arrive(absl::OkStatus());
  }
}

void StagedWrite::CopyOut() {
  absl::Status s = c_.gpu->CopyToHost(c_.bounce.data(), c_.gpu_bytes(), c_.length,
                                      [self = shared_from_this()](absl::Status s) {
                                        self->Arrive(s);
                                      });
  if (!s.ok()) Arrive(s);
}

void StagedWrite::TakeGrant() {
  absl::StatusOr<StageGrant> g = c_.call->TakeGrant(c_.deadline);
  if (g.ok()) grant_ = *g;
  Arrive(g.status());
}

void StagedWrite::Arrive(const absl::Status& status) {
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && status_.ok()) status_ = status;
    if (--waiting_ > 0) return;
    failed = status_;
  }
  if (!failed.ok()) return Finish(0, failed);
  PostWire();
}

void StagedWrite::PostWire() {
  fabric::RemoteSlice remote = c_.direct;
  if (grant_) remote = {grant_->address, grant_->key};
  absl::Status posted = c_.endpoint->PostWrite(
      c_.local_slice(), remote,
      [self = shared_from_this()](absl::Status s) { self->WireDone(std::move(s)); });
  if (!posted.ok()) Finish(0, posted);
}

void StagedWrite::WireDone(absl::Status status) {
  // Our bounce chunk is free once its bytes are on the peer, before the peer copies them in.
  c_.bounce = ChunkLease();
  if (!status.ok() || !c_.call) {
    const uint64_t bytes = status.ok() ? c_.length : 0;
    return Finish(bytes, std::move(status));
  }
  ReportToPeer();
}

void StagedWrite::ReportToPeer() {
  // The bytes are in the peer's chunk; it copies them in and reports (OnCopied).
  if (!c_.call->Report(grant_->grant, c_.op->remote_offset + c_.offset, c_.length, c_.token)) {
    return Finish(0, absl::UnavailableError("Stage: the peer closed the call"));
  }
  // The chunk ends here (OnCopied settles it, `done_` never runs): let go now, see Finish.
  c_.call.reset();
  done_ = nullptr;
}

void StagedWrite::Finish(uint64_t bytes, absl::Status status) {
  // Everything the chunk was given goes before `done` hands its window slot back, not when
  // this object dies: a closure on another thread may still hold it after the chunk ended
  // (the copy engine's CopyOut callback when the other step arrived last), and `done_` holds
  // the sender, so the transfer's ops, buffers and registrations; the call holds the peer's
  // pool. Run returns once every slot is back, and the engine then drops the sender to free
  // them: a stale closure must not keep them past that (stage_sender_test's TearDown).
  c_.bounce = ChunkLease();
  c_.call.reset();
  ChunkDone done = std::exchange(done_, nullptr);
  std::move(done)(bytes, std::move(status));
}

}  // namespace ferry::server
