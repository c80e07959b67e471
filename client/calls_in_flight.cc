#include "client/calls_in_flight.h"

namespace ferry {

CallsInFlight::Hold::Hold(CallsInFlight& calls) : calls_(calls) {
  absl::MutexLock lock(&calls_.mu_);
  ++calls_.holds_;
}

CallsInFlight::Hold::~Hold() {
  Ended();
  absl::MutexLock lock(&calls_.mu_);
  --calls_.holds_;
}

void CallsInFlight::Hold::Started(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&calls_.mu_);
  ctx_ = ctx;
  calls_.started_.insert(ctx);
}

void CallsInFlight::Hold::Ended() {
  absl::MutexLock lock(&calls_.mu_);
  if (ctx_ != nullptr) calls_.started_.erase(ctx_);
  ctx_ = nullptr;
}

CallsInFlight::~CallsInFlight() { EndAll(); }

void CallsInFlight::EndAll() {
  absl::MutexLock lock(&mu_);
  // Under the lock, so that no context is ended (and destroyed) while it is cancelled here.
  // TryCancel only marks the call: gRPC reports its end later, through the callback queue's
  // own threads, never inline here (which would wait for this lock in Ended).
  for (grpc::ClientContext* ctx : started_) ctx->TryCancel();
  mu_.Await(absl::Condition(this, &CallsInFlight::NoHoldsLocked));
}

}  // namespace ferry
