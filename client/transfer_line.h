// A client's small transfers over one Agent.TransferStream call that its threads share, so
// that Client::Run of a few ops costs no call set-up: on gRPC 1.51 a unary callback call
// costs the agent about twice the CPU of a message on an open stream (bench/results/
// 2026-12-04-callback-probe.txt), and a one-op transfer is mostly that.
//
// No thread of its own: the calling threads take turns reading the call's completion queue
// (one reads while the others wait for it to hand them their answer or the turn), so a
// lone caller reads its own answer with no hop to another thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ferry_client.h"
#include "ferry/v1/agent.grpc.pb.h"

namespace ferry {

class TransferLine {
 public:
  // Starts the call on `stub` with `ctx` (the session's metadata; no deadline: the line
  // lives as long as its client).
  TransferLine(ferry::v1::Agent::Stub& stub, std::unique_ptr<grpc::ClientContext> ctx);
  // Cancels the call and waits for gRPC to be done with it. No Run may be running.
  ~TransferLine();

  struct Outcome {
    // What Client::Run returns: the transfer's result, its refusal, DEADLINE_EXCEEDED when
    // no answer came by `wait`, or UNAVAILABLE when the call ended first.
    absl::StatusOr<ferry::v1::TransferResult> result;
    // False when the call ended before gRPC took the request whole (so the agent did not
    // start it, or, for a write cut short by the end, at most read part of it): the caller
    // may run the transfer on a new line. Running a transfer twice moves the same bytes.
    bool sent = false;
  };
  // Any thread: sends the transfer and waits for its answer, at most `wait` (a request not
  // yet written by then is dropped). Calls from several threads run at once (their answers
  // come in the order their transfers end).
  Outcome Run(const std::vector<OpSpec>& ops, absl::Duration timeout, bool include_ops,
              absl::Duration wait);
  // Whether the call has ended (a Run on it would not be sent).
  bool ended() const;

 private:
  // A caller waiting for its answer.
  struct Waiter {
    std::optional<absl::StatusOr<ferry::v1::TransferResult>> answer;
    bool written = false;   // gRPC took its request whole
    bool answered = false;  // the agent answered it
  };
  enum class Op : intptr_t { kStart = 1, kRead, kWrite, kFinish };
  // Idle this long, a line is checked for an end no one saw before a request goes on it.
  static constexpr absl::Duration kIdle = absl::Milliseconds(20);

  // Takes the events already on the queue without blocking (the call may have ended while
  // no one read it). Only with no reader.
  void DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the queue until `deadline`, handling one event if it comes; false at the deadline.
  bool ReadQueueLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnEventLocked(Op op, bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the waiters of a message read.
  void DeliverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The call is over (an op failed, or reading ended): asks for its status once.
  void EndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every waiter left gets `why`.
  void FailWaitersLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<grpc::ClientContext> ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<
      grpc::ClientAsyncReaderWriter<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>>
      call_;

  mutable absl::Mutex mu_;
  bool reading_queue_ ABSL_GUARDED_BY(mu_) = false;  // a caller is in cq_.AsyncNext
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // ops started on call_ and not yet completed
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // kStart completed: writes may start
  bool ending_ ABSL_GUARDED_BY(mu_) = false;  // Finish was asked for
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  // The message being written (gRPC holds on to it until kWrite) and those queued after it.
  std::unique_ptr<ferry::v1::StreamedTransfer> writing_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<ferry::v1::StreamedTransfer>> to_write_ ABSL_GUARDED_BY(mu_);
  // The read in progress fills it: gRPC writes it inside the reading caller's AsyncNext
  // (outside mu_, but only one caller reads at a time), which then delivers it under mu_.
  ferry::v1::StreamedResults read_ ABSL_GUARDED_BY(mu_);
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_answer_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_map<uint64_t, Waiter*> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry
