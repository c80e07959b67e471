#pragma once
// The calls a client has open on gRPC's callback API, so that it can end them all, and wait
// until they are gone, before it lets go of its channel.
//
// Why it must wait: every call's ClientContext holds a reference to the grpc::Channel. On
// gRPC 1.51 with the epoll1 poller, callback calls complete on one process-wide queue
// (CompletionQueue::CallbackAlternativeCQ, completion_queue_cc.cc) served by threads of
// gRPC's own; the last Channel to go shuts that queue down, joins those threads and deletes
// the queue. When a call's context held the last reference, the channel went on one of those
// threads: it could not join itself, and went back to polling the queue it had just deleted
// ("assertion failed: prior > 0" in grpc_cq_internal_unref, then abort). A client that waits
// here, on its own thread, before its channel goes, keeps that last release on that thread.

#include <cstddef>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"

namespace ferry {

class CallsInFlight {
 public:
  // One call, counted from before it starts until after its ClientContext is destroyed.
  // Declare it before the context in whatever holds both, so that it goes after it.
  class Hold {
   public:
    explicit Hold(CallsInFlight& calls);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

    // From here until Ended, EndAll cancels the call through `ctx`.
    void Started(grpc::ClientContext* ctx);
    // The call has ended (gRPC runs its last callback): its context may go from here on, so
    // EndAll no longer reaches it. Idempotent.
    void Ended();

   private:
    CallsInFlight& calls_;
    grpc::ClientContext* ctx_ = nullptr;
  };

  CallsInFlight() = default;
  // EndAll.
  ~CallsInFlight();
  CallsInFlight(const CallsInFlight&) = delete;
  CallsInFlight& operator=(const CallsInFlight&) = delete;

  // Cancels every call that has not ended and waits until every Hold is gone. Never call it
  // from one of gRPC's callbacks (a CallDone, a reactor's method): it would wait for itself.
  void EndAll();

 private:
  bool NoHoldsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return holds_ == 0; }

  absl::Mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> started_ ABSL_GUARDED_BY(mu_);
  size_t holds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry
