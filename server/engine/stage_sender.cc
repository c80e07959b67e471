#include "server/engine/stage_sender.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/engine/staged_read.h"
#include "server/engine/staged_write.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

StageSender::StageSender(std::shared_ptr<Transfer> transfer, PlannedOps planned,
                         std::vector<StagedOp> ops, Deps deps)
    : transfer_(std::move(transfer)), planned_(std::move(planned)), ops_(std::move(ops)),
      deps_(std::move(deps)),
      depth_(transfer_->policy().policy.staging_depth),
      chunk_(transfer_->policy().policy.staging_chunk_bytes) {
  absl::MutexLock lock(&mu_);
  progress_.assign(ops_.size(), OpProgress{});
}

StageSender::~StageSender() = default;

void StageSender::Run() {
  for (size_t slot = 0; slot < ops_.size(); ++slot) {
    absl::Status s = RunOp(slot);
    if (!s.ok()) ChunkEnded(slot, 0, s, /*launched=*/false);
  }
  // Every chunk in flight ends one way or another: wait for them (bounded by the deadline,
  // after which the reaper has settled the ops anyway).
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    mu_.AwaitWithDeadline(absl::Condition(&idle), transfer_->deadline() + absl::Seconds(5));
  }
  CloseCalls();
}

void StageSender::CloseCalls() {
  std::vector<std::shared_ptr<StageCall>> calls;
  {
    absl::MutexLock lock(&calls_mu_);
    calls.swap(calls_);
  }
  for (auto& call : calls) {
    absl::Status verdict = call->Close(transfer_->deadline());
    if (!verdict.ok()) spdlog::warn("transfer {}: {}", transfer_->id(), verdict.ToString());
  }
}

void StageSender::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  absl::MutexLock lock(&calls_mu_);
  for (auto& call : calls_) call->Cancel();
}

bool StageSender::WaitWindow(size_t slot, uint32_t window) {
  absl::MutexLock lock(&mu_);
  auto room = [this, window]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return in_flight_ < window || cancelled_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&room), transfer_->deadline()) || cancelled_) {
    return false;
  }
  ++in_flight_;
  ++progress_[slot].in_flight;
  return true;
}

absl::StatusOr<std::shared_ptr<StageCall>> StageSender::CallFor(const StagedOp& staged) {
  const PlannedOp& op = (*planned_)[staged.index];
  StageCallSpec spec{op.remote->node,    op.remote->name, op.type == ferry::v1::READ,
                     staged.peer.rail.provider, chunk_,   depth_,
                     transfer_->deadline(),   staged.peer.peer_rail.nic};
  // One Stage call per remote buffer and direction for the whole transfer.
  {
    absl::MutexLock lock(&calls_mu_);
    for (auto& call : calls_) {
      const StageCallSpec& s = call->spec();
      if (s.node == spec.node && s.buffer == spec.buffer && s.read == spec.read &&
          s.nic == spec.nic) {
        return call;
      }
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<StageCall> call, deps_.stage_calls(spec, this));
  {
    // Listed before it opens, so Cancel() reaches an Open that waits for its first grant.
    absl::MutexLock lock(&calls_mu_);
    calls_.push_back(call);
  }
  absl::Status opened = call->Open();
  if (!opened.ok()) {
    // A call that never opened is not closed later: end it now and forget it.
    call->Cancel();
    absl::MutexLock lock(&calls_mu_);
    calls_.erase(std::find(calls_.begin(), calls_.end(), call));
    return opened;
  }
  return call;
}

absl::Status StageSender::RunOp(size_t slot) {
  const StagedOp& staged = ops_[slot];
  const PlannedOp& op = (*planned_)[staged.index];
  const bool remote_staged = op.remote->mode == LegMode::kStaged;
  const bool local_staged = staged.local.mode == LegMode::kStaged;
  std::shared_ptr<StageCall> call;
  uint64_t unit = chunk_;
  if (remote_staged) {
    ASSIGN_OR_RETURN(call, CallFor(staged));
    unit = std::min(unit, call->grant_length());
    absl::MutexLock lock(&mu_);
    progress_[slot].call = call.get();
  }
  std::shared_ptr<StagingPool> local_pool;
  if (local_staged) {
    ASSIGN_OR_RETURN(local_pool, deps_.bounce->Get(staged.local.bounce_numa, transfer_->policy()));
    unit = std::min(unit, local_pool->chunk_bytes());
  }
  // At most `depth` chunks in flight per staged leg: with both legs staged, `depth` of ours
  // in copy-out and `depth` of the peer's granted chunks.
  const uint32_t window = depth_ * std::max(1, int{local_staged} + int{remote_staged});
  transfer_->MarkPosted(staged.index);
  for (uint64_t offset = 0; offset < op.length; offset += unit) {
    {
      absl::MutexLock lock(&mu_);
      if (progress_[slot].failed) break;
    }
    if (!WaitWindow(slot, window)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "transfer ", transfer_->id(),
          " did not finish before its deadline (or the agent is stopping)"));
    }
    StartChunk(slot, offset, std::min(unit, op.length - offset), call, local_pool);
  }
  return absl::OkStatus();
}

void StageSender::StartChunk(size_t slot, uint64_t offset, uint64_t length,
                             const std::shared_ptr<StageCall>& call,
                             const std::shared_ptr<StagingPool>& local_pool) {
  const StagedOp& staged = ops_[slot];
  const PlannedOp& op = (*planned_)[staged.index];
  StagedChunk chunk;
  chunk.endpoint = staged.peer.endpoint.get();
  chunk.rail = staged.peer.rail;
  chunk.op = &op;
  chunk.offset = offset;
  chunk.length = length;
  chunk.deadline = transfer_->deadline();
  chunk.token = slot;  // echoed in StageCopied
  chunk.call = call;
  if (local_pool) {
    chunk.gpu = &deps_.gpus->device(op.local->gpu());
    chunk.bounce = local_pool->Acquire(chunk.deadline);
    if (!chunk.bounce) {
      return ChunkEnded(slot, 0,
                        absl::DeadlineExceededError("no free bounce chunk before the deadline"));
    }
  }
  if (!call) {
    const fabric::RemoteSlice* key = op.remote->KeyFor(staged.peer.peer_rail);
    if (key == nullptr) {
      return ChunkEnded(slot, 0, absl::FailedPreconditionError(absl::StrCat(
                                     "peer: ", op.remote->name, " has no key for ",
                                     staged.peer.peer_rail.ToString())));
    }
    chunk.direct = {key->address + op.remote_offset + offset, key->key};
  }
  ChunkDone done = [self = shared_from_this(), slot](uint64_t bytes, absl::Status s) {
    self->ChunkEnded(slot, bytes, s);
  };
  if (op.type == ferry::v1::WRITE) {
    StagedWrite::Start(std::move(chunk), std::move(done));
  } else {
    StagedRead::Start(std::move(chunk), std::move(done));
  }
}

void StageSender::OnCopied(uint64_t token, uint64_t bytes) {
  if (token >= ops_.size()) {
    spdlog::error("transfer {}: Stage reported an unknown op {}", transfer_->id(), token);
    return;
  }
  ChunkEnded(static_cast<size_t>(token), bytes, absl::OkStatus());
}

void StageSender::OnCallFailed(const StageCall* call, const absl::Status& why) {
  // Every op of the call with chunks in flight: their copy-ins will never be reported. Ops
  // that already failed hold window slots too, which must come back as well.
  std::vector<size_t> victims, open;
  {
    absl::MutexLock lock(&mu_);
    for (size_t slot = 0; slot < ops_.size(); ++slot) {
      const OpProgress& p = progress_[slot];
      if (p.call != call || p.in_flight == 0) continue;
      victims.push_back(slot);
      if (!p.failed) open.push_back(slot);
    }
  }
  // Settled before their slots go back: Run returns once every slot is back, and only then
  // may the op have settled (the engine joins Run at shutdown).
  for (size_t slot : open) ChunkEnded(slot, 0, why, /*launched=*/false);
  absl::MutexLock lock(&mu_);
  for (size_t slot : victims) {
    OpProgress& p = progress_[slot];
    in_flight_ -= p.in_flight;
    p.in_flight = 0;
  }
}

void StageSender::ChunkEnded(size_t slot, uint64_t bytes, const absl::Status& status,
                             bool launched) {
  const StagedOp& staged = ops_[slot];
  const PlannedOp& op = (*planned_)[staged.index];
  if (deps_.ledger != nullptr && launched) {
    if (status.ok()) {
      deps_.ledger->Carried(staged.peer.rail, op.remote->node, bytes);
    } else if (status.code() == absl::StatusCode::kUnavailable) {
      deps_.ledger->Failed(staged.peer.rail, op.remote->node, status, false, absl::Now());
    }
  }
  bool settle = false;
  uint32_t chunks = 0;
  {
    absl::MutexLock lock(&mu_);
    OpProgress& p = progress_[slot];
    if (!p.failed) {
      if (!status.ok()) {
        p.failed = true;
        settle = true;
      } else {
        p.done_bytes += bytes;
        ++p.chunks;
        settle = p.done_bytes >= op.length;
      }
    }
    chunks = p.chunks;
  }
  if (settle) {
    std::vector<ferry::v1::Leg> legs = transfer_->LegsOf(staged.index);
    if (legs.size() > kRemoteLeg) {
      if (staged.local.mode == LegMode::kStaged) legs[kLocalLeg].set_chunks(chunks);
      if (op.remote->mode == LegMode::kStaged) legs[kRemoteLeg].set_chunks(chunks);
    }
    transfer_->SetLegs(staged.index, std::move(legs));
    deps_.settle(staged.index, status, staged.peer.rail.provider);
  }
  // The chunk's window slot goes back last: Run returns once every slot is back, so that
  // every op has settled by then, as Run promises.
  if (!launched) return;
  absl::MutexLock lock(&mu_);
  OpProgress& p = progress_[slot];
  if (p.in_flight > 0) {
    --p.in_flight;
    --in_flight_;
  }
}

}  // namespace ferry::server
