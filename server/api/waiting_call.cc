#include "server/api/waiting_call.h"

#include <memory>
#include <utility>

#include <grpcpp/alarm.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/grpc_status.h"

namespace ferry::server {
namespace {

using ferry::v1::TransferResult;

// Owns itself (self_) until OnDone, and the `ended` hook holds it too: a transfer that ends
// after the call finds it finished and answers nobody. Finish is called once, under mu_, by
// whichever comes first: the answer, a refusal, the answer_by alarm, or the end of the
// call. Nothing finishes while `start` runs: an end of the call waits for it (the request
// goes after OnDone), and a result that comes meanwhile is answered once it returned.
class WaitingReactor final : public grpc::ServerUnaryReactor,
                             public std::enable_shared_from_this<WaitingReactor> {
 public:
  WaitingReactor(absl::Time deadline, WaitingCall call)
      : deadline_(deadline), call_(std::move(call)) {}

  void Begin(std::shared_ptr<WaitingReactor> self, WorkerPool* starters) {
    {
      absl::MutexLock lock(&mu_);
      self_ = std::move(self);
    }
    std::optional<std::string> peer = call_.may_block();
    if (!peer) {
      Start();
      return;
    }
    // A peer must answer first (a blocking call): on a starter, not on this gRPC thread.
    starters->Run(*peer, [self = shared_from_this()] { self->Start(); });
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    if (!starting_) FinishEndedLocked();
  }

  void OnDone() override {
    std::shared_ptr<WaitingReactor> last;
    {
      absl::MutexLock lock(&mu_);
      last = std::move(self_);
    }
    // `last` may be the final owner: this goes with it, after the lock.
  }

 private:
  void Start() {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // the call ended while this waited for a starter
      starting_ = true;
    }
    std::shared_ptr<WaitingReactor> self = shared_from_this();
    absl::StatusOr<uint64_t> started =
        call_.start([self](TransferResult result) { self->Ended(std::move(result)); });
    absl::MutexLock lock(&mu_);
    starting_ = false;
    if (!started.ok()) {
      FinishLocked(ToGrpcStatus(started.status()));
      return;
    }
    id_ = *started;
    if (result_) {
      RespondLocked(*std::move(result_));
    } else if (ended_) {
      FinishEndedLocked();
    } else if (call_.answer_by) {
      // Fires on gRPC's executor; a reactor gone by then is not kept for it (the alarm
      // goes with it, cancelled).
      alarm_ = std::make_unique<grpc::Alarm>();
      alarm_->Set(absl::ToChronoTime(*call_.answer_by),
                  [weak = weak_from_this()](bool fired) {
                    if (!fired) return;
                    if (auto reactor = weak.lock()) reactor->AnswerAsItStands();
                  });
    }
  }

  void Ended(TransferResult result) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // nobody to tell: the call ended
    if (starting_) {
      result_ = std::move(result);  // answered once `start` returned
      return;
    }
    RespondLocked(std::move(result));
  }

  void AnswerAsItStands() {
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      id = *id_;
    }
    // Outside mu_: it takes the engine's locks, and mu_ is never held while they are taken.
    TransferResult now = call_.as_it_stands(id);
    absl::MutexLock lock(&mu_);
    if (!finished_) RespondLocked(std::move(now));
  }

  void RespondLocked(TransferResult result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    call_.respond(std::move(result));
    FinishLocked(grpc::Status::OK);
  }

  // The call ended before the transfer: its deadline passed, or the client went away.
  void FinishEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::Now() < deadline_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    } else if (id_) {
      FinishLocked(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                absl::StrCat("transfer ", *id_, " is still running")));
    } else {
      FinishLocked(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                "the call's deadline passed before the transfer started; "
                                "nothing was started"));
    }
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  const absl::Time deadline_;
  const WaitingCall call_;

  absl::Mutex mu_;
  std::shared_ptr<WaitingReactor> self_ ABSL_GUARDED_BY(mu_);
  bool starting_ ABSL_GUARDED_BY(mu_) = false;  // call_.start is running
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // OnCancel came
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
  std::optional<uint64_t> id_ ABSL_GUARDED_BY(mu_);
  std::optional<TransferResult> result_ ABSL_GUARDED_BY(mu_);  // came while starting
  // The answer_by, set once by Start: made only then, since an Alarm costs every call a
  // grpc_init and grpc_shutdown (GrpcLibrary) and a timer's state.
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerUnaryReactor* StartWaitingCall(grpc::CallbackServerContext* ctx,
                                           WorkerPool* starters, WaitingCall call) {
  auto reactor =
      std::make_shared<WaitingReactor>(absl::FromChrono(ctx->deadline()), std::move(call));
  WaitingReactor* raw = reactor.get();
  raw->Begin(std::move(reactor), starters);
  return raw;
}

}  // namespace ferry::server
