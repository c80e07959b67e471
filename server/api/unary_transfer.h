#pragma once
// Agent.Transfer: submit and answer once the transfer ended, in one call and with no thread
// waiting on it: the engine's finished hook answers. Its requests are parsed into kept
// arenas (TransferMessages), so a batch of thousands of ops costs no malloc per op.

#include <memory>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/worker_pool.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "server/api/transfer_calls.h"

namespace ferry::server {

// Where gRPC puts each Agent.Transfer call's request and result: in a RequestArena, kept
// for the next call when the call is done (up to kKeptArenas; more calls at once get
// arenas of their own that go with them). Thread-safe, as gRPC requires; must outlive the
// server's calls.
class TransferMessages final
    : public grpc::MessageAllocator<ferry::v1::TransferRequest, ferry::v1::TransferResult> {
 public:
  static constexpr size_t kKeptArenas = 8;

  TransferMessages();
  ~TransferMessages() override;

  grpc::MessageHolder<ferry::v1::TransferRequest, ferry::v1::TransferResult>* AllocateMessages()
      override;
  // Arenas kept for the next calls (tests).
  size_t kept() const;

 private:
  class Holder;
  // A done call's holder: kept, emptied, or deleted when kKeptArenas are kept already.
  void Return(Holder* holder);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Holder>> kept_ ABSL_GUARDED_BY(mu_);
};

// The call's reactor (server/api/waiting_call.h): starts `request` with `calls->Start` (on
// `starters` when `calls->MayBlockOn` says it may block) and answers with the result when the
// transfer ended; a refusal is the call's status. When the call ends first, the transfer
// runs on (Cancel ends it) and the call answers DEADLINE_EXCEEDED naming the transfer if
// its deadline passed, else CANCELLED.
grpc::ServerUnaryReactor* StartUnaryTransfer(grpc::CallbackServerContext* ctx,
                                             const ferry::v1::TransferRequest* request,
                                             ferry::v1::TransferResult* result,
                                             WorkerPool* starters,
                                             std::shared_ptr<const TransferCalls> calls);

}  // namespace ferry::server
