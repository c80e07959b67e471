#include "client/transfer_line.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "client/answer_turns.h"

namespace ferry {
namespace {

// The queue's tags are the ops themselves.
template <typename Op>
void* TagOf(Op op) {
  return reinterpret_cast<void*>(static_cast<intptr_t>(op));
}
template <typename Op>
Op OpOf(void* tag) {
  return static_cast<Op>(reinterpret_cast<intptr_t>(tag));
}

}  // namespace

TransferLine::TransferLine(ferry::v1::Agent::Stub& stub, std::unique_ptr<grpc::ClientContext> ctx)
    : ctx_(std::move(ctx)) {
  absl::MutexLock lock(&mu_);
  call_ = stub.PrepareAsyncTransferStream(ctx_.get(), &cq_);
  // A read may start at once; writes wait for kStart (StartCall sends the initial metadata
  // with the ops a write uses, and one of those may run at a time).
  call_->StartCall(TagOf(Op::kStart));
  call_->Read(&read_, TagOf(Op::kRead));
  pending_ = 2;
}

TransferLine::~TransferLine() {
  absl::MutexLock lock(&mu_);
  // No Run runs, so nobody reads the queue: end the call and take every event gRPC owes.
  EndLocked();
  while (pending_ > 0 && ReadQueueLocked(absl::InfiniteFuture())) {
  }
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
}

bool TransferLine::ended() const {
  absl::MutexLock lock(&mu_);
  return ending_ || ended_;
}

TransferLine::Outcome TransferLine::Run(const std::vector<OpSpec>& ops, absl::Duration timeout,
                                        bool include_ops, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  auto request = std::make_unique<ferry::v1::StreamedTransfer>();
  FillSubmitRequest(ops, timeout, request->mutable_transfer()->mutable_submit());
  request->mutable_transfer()->set_include_ops(include_ops);
  Waiter waiter;
  absl::MutexLock lock(&mu_);
  // A line that sat idle may have ended unseen (the agent restarted): look before sending.
  // While answers keep coming it cannot have.
  if (!reading_queue_ && absl::Now() - last_answer_ > kIdle) DrainLocked();
  if (ending_ || ended_) return {absl::UnavailableError("the transfer line has ended"), false};
  const uint64_t tag = next_tag_++;
  request->set_tag(tag);
  waiters_[tag] = &waiter;
  to_write_.push_back(std::move(request));
  if (started_ && writing_ == nullptr) StartWriteLocked();

  AwaitAnswer(mu_, reading_queue_, waiter.answer, deadline,
              [this](absl::Time until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                return ReadQueueLocked(until);
              });
  if (!waiter.answer.has_value()) {
    waiters_.erase(tag);  // an answer that comes later is dropped
    // Not written yet: it never will be, so no transfer starts after its caller gave up.
    std::erase_if(to_write_, [tag](const auto& queued) { return queued->tag() == tag; });
    return {absl::DeadlineExceededError(absl::StrCat(
                "no answer from the agent within ", absl::FormatDuration(wait),
                " (the transfer's timeout and 5 s)")),
            true};
  }
  return {*std::move(waiter.answer), waiter.written || waiter.answered};
}

void TransferLine::DrainLocked() {
  // A deadline in the past (the epoch: gRPC reads a negative time as no deadline): only what
  // is there now, after gRPC polled the channel's socket once.
  while (!ended_ && ReadQueueLocked(absl::UnixEpoch())) {
  }
}

bool TransferLine::ReadQueueLocked(absl::Time deadline) {
  void* tag = nullptr;
  bool ok = false;
  reading_queue_ = true;
  mu_.Unlock();
  const auto status = cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(deadline));
  mu_.Lock();
  reading_queue_ = false;
  // SHUTDOWN cannot come: only the destructor shuts the queue down, after its last read.
  if (status != grpc::CompletionQueue::GOT_EVENT) return false;
  OnEventLocked(OpOf<Op>(tag), ok);
  return true;
}

void TransferLine::OnEventLocked(Op op, bool ok) {
  --pending_;
  switch (op) {
    case Op::kStart:
      if (!ok) {
        EndLocked();
        break;
      }
      started_ = true;
      if (!to_write_.empty()) StartWriteLocked();
      break;
    case Op::kWrite: {
      const uint64_t tag = writing_->tag();
      writing_.reset();
      if (!ok) {
        EndLocked();
        break;
      }
      if (auto it = waiters_.find(tag); it != waiters_.end()) it->second->written = true;
      if (!ending_ && !to_write_.empty()) StartWriteLocked();
      break;
    }
    case Op::kRead:
      if (!ok) {  // the agent ended the call, or it broke
        EndLocked();
        break;
      }
      DeliverLocked();
      if (!ending_) {
        call_->Read(&read_, TagOf(Op::kRead));
        ++pending_;
      }
      break;
    case Op::kFinish:
      ended_ = true;
      FailWaitersLocked(absl::UnavailableError(absl::StrCat(
          "the agent's transfer stream ended before the answer: ",
          FromGrpcStatus(end_status_).ToString())));
      break;
  }
}

void TransferLine::DeliverLocked() {
  for (ferry::v1::StreamedResult& r : *read_.mutable_results()) {
    auto it = waiters_.find(r.tag());
    if (it == waiters_.end()) continue;  // its caller gave up waiting
    Waiter* waiter = it->second;
    waiters_.erase(it);
    waiter->answered = true;
    if (r.code() != 0) {
      waiter->answer = absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
    } else {
      waiter->answer = std::move(*r.mutable_result());
    }
  }
  if (read_.results_size() > 0) last_answer_ = absl::Now();
  read_.Clear();
}

void TransferLine::StartWriteLocked() {
  writing_ = std::move(to_write_.front());
  to_write_.pop_front();
  call_->Write(*writing_, TagOf(Op::kWrite));
  ++pending_;
}

void TransferLine::EndLocked() {
  if (ending_) return;
  ending_ = true;
  // Whatever ended it, make sure every op still open completes, then ask for the status.
  ctx_->TryCancel();
  call_->Finish(&end_status_, TagOf(Op::kFinish));
  ++pending_;
  // Not written: their callers may send them on a new line.
  to_write_.clear();
}

void TransferLine::FailWaitersLocked(const absl::Status& why) {
  for (auto& [tag, waiter] : waiters_) waiter->answer = why;
  waiters_.clear();
}

}  // namespace ferry
