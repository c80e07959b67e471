#include "server/api/unary_transfer.h"

#include <functional>
#include <utility>

#include "server/api/request_arena.h"
#include "server/api/waiting_call.h"

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

grpc::ServerUnaryReactor* StartUnaryTransfer(grpc::CallbackServerContext* ctx,
                                             const TransferRequest* request,
                                             TransferResult* result, WorkerPool* starters,
                                             std::shared_ptr<const TransferCalls> calls) {
  WaitingCall call;
  call.start = [request, calls](std::function<void(TransferResult)> ended) {
    return calls->Start(*request, std::move(ended));
  };
  call.may_block = [request, calls] { return calls->MayBlockOn(*request); };
  call.respond = [result](TransferResult ended) { *result = std::move(ended); };
  return StartWaitingCall(ctx, starters, std::move(call));
}

}  // namespace ferry::server
