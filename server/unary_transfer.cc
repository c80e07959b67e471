#include "server/unary_transfer.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/grpc_status.h"
#include "server/request_arena.h"

namespace ferry::server {

using ferry::v1::TransferRequest;
using ferry::v1::TransferResult;

class TransferMessages::Holder final
    : public grpc::MessageHolder<TransferRequest, TransferResult> {
 public:
  explicit Holder(TransferMessages* owner) : owner_(owner) { Fill(); }

  // gRPC calls it once the call is done (after OnDone): nothing refers to the messages now.
  void Release() override { owner_->Return(this); }

  void Empty() {
    arena_.Reset();
    Fill();
  }

 private:
  void Fill() {
    set_request(google::protobuf::Arena::CreateMessage<TransferRequest>(arena_.arena()));
    set_response(google::protobuf::Arena::CreateMessage<TransferResult>(arena_.arena()));
  }

  TransferMessages* const owner_;
  RequestArena arena_;
};

TransferMessages::TransferMessages() = default;
TransferMessages::~TransferMessages() = default;

grpc::MessageHolder<TransferRequest, TransferResult>* TransferMessages::AllocateMessages() {
  {
    absl::MutexLock lock(&mu_);
    if (!kept_.empty()) {
      Holder* holder = kept_.back().release();
      kept_.pop_back();
      return holder;
    }
  }
  return new Holder(this);
}

void TransferMessages::Return(Holder* holder) {
  std::unique_ptr<Holder> owned(holder);
  {
    absl::MutexLock lock(&mu_);
    if (kept_.size() >= kKeptArenas) return;  // not kept: no use emptying it first
  }
  owned->Empty();  // outside the lock: it destroys the call's messages
  absl::MutexLock lock(&mu_);
  if (kept_.size() < kKeptArenas) kept_.push_back(std::move(owned));
}

size_t TransferMessages::kept() const {
  absl::MutexLock lock(&mu_);
  return kept_.size();
}

namespace {

// Owns itself (self_) until OnDone, and the answer hook holds it too: a transfer that ends
// after the call finds it finished and answers nobody. Finish is called once, under mu_,
// by whichever comes first: the answer, a refusal, or the end of the call. The end of the
// call waits for a start in progress (it reads the request, which goes after OnDone).
class UnaryTransfer final : public grpc::ServerUnaryReactor,
                            public std::enable_shared_from_this<UnaryTransfer> {
 public:
  UnaryTransfer(absl::Time deadline, const TransferRequest* request, TransferResult* result,
                TransferCalls calls)
      : deadline_(deadline), request_(request), result_(result), calls_(std::move(calls)) {}

  void Begin(std::shared_ptr<UnaryTransfer> self, WorkerPool* starters) {
    {
      absl::MutexLock lock(&mu_);
      self_ = std::move(self);
    }
    if (!calls_.may_block(*request_)) {
      Start();
      return;
    }
    // A peer must answer first (a blocking call): on a starter, not on this gRPC thread.
    starters->Run([self = shared_from_this()] { self->Start(); });
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    if (!starting_) FinishEndedLocked();
  }

  void OnDone() override {
    std::shared_ptr<UnaryTransfer> last;
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
    std::shared_ptr<UnaryTransfer> self = shared_from_this();
    absl::StatusOr<uint64_t> started =
        calls_.start(*request_, [self](TransferResult result) { self->Answer(std::move(result)); });
    absl::MutexLock lock(&mu_);
    starting_ = false;
    if (!started.ok()) {
      FinishLocked(ToGrpcStatus(started.status()));
      return;
    }
    id_ = *started;
    if (ended_) FinishEndedLocked();
  }

  void Answer(TransferResult result) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // nobody to tell: the call ended
    *result_ = std::move(result);
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
  const TransferRequest* const request_;
  TransferResult* const result_;  // written once, just before Finish
  const TransferCalls calls_;

  absl::Mutex mu_;
  std::shared_ptr<UnaryTransfer> self_ ABSL_GUARDED_BY(mu_);
  bool starting_ ABSL_GUARDED_BY(mu_) = false;  // calls_.start is reading the request
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // OnCancel came
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
  std::optional<uint64_t> id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerUnaryReactor* StartUnaryTransfer(grpc::CallbackServerContext* ctx,
                                             const TransferRequest* request,
                                             TransferResult* result, WorkerPool* starters,
                                             TransferCalls calls) {
  auto reactor = std::make_shared<UnaryTransfer>(absl::FromChrono(ctx->deadline()), request,
                                                 result, std::move(calls));
  UnaryTransfer* raw = reactor.get();
  raw->Begin(std::move(reactor), starters);
  return raw;
}

}  // namespace ferry::server
