// Many transfers over one call (Agent.TransferStream), for a caller that issues many small
// ones: Send starts one without waiting, Next returns the answers in the order the
// transfers end, each with the tag it was sent with.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ferry_client.h"
#include "ferry/v1/agent.grpc.pb.h"

namespace ferry {

class TransferStream {
 public:
  struct Answer {
    uint64_t tag = 0;
    // What Client::Run would have returned: the transfer's result (its state says whether
    // every op landed), or why the request was refused and nothing moved.
    absl::StatusOr<ferry::v1::TransferResult> result;
  };

  static absl::StatusOr<std::unique_ptr<TransferStream>> Open(
      ferry::v1::Agent::Stub& stub, std::unique_ptr<grpc::ClientContext> ctx);
  // Cancels the call if it still runs: transfers already sent run on in the agent. A Send
  // blocked on another thread returns first; none may start after.
  ~TransferStream();

  // Sends transfer `tag` (the caller's: its answer carries it). The agent reads at most
  // 1024 requests ahead of the answers it has written; past that, requests wait in the
  // call's flow-control window, and Send blocks once that is full: a caller that sends
  // without reading answers is held back. UNAVAILABLE once the call broke (Finish says why).
  absl::Status Send(uint64_t tag, const std::vector<OpSpec>& ops,
                    absl::Duration timeout = absl::Seconds(60), bool include_ops = false);
  // No more Sends: the call ends once every transfer sent is answered.
  absl::Status CloseSend();
  // The next answer, blocking until one comes. OUT_OF_RANGE once the call ended and every
  // answer was returned; Finish then says how it ended.
  absl::StatusOr<Answer> Next();
  // How the call ended: after Next returned OUT_OF_RANGE; or, to give up, at any time but
  // not while another thread is in Next (then it cancels the call, and the answers not yet
  // read are dropped).
  absl::Status Finish();

 private:
  TransferStream(std::unique_ptr<grpc::ClientContext> ctx,
                 std::unique_ptr<grpc::ClientReaderWriter<ferry::v1::StreamedTransfer,
                                                          ferry::v1::StreamedResults>> call);

  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>>
      call_;
  // One sender and one receiver may work at once (gRPC allows a Write beside a Read); the
  // end of the call is decided once.
  absl::Mutex send_mu_;
  bool send_closed_ ABSL_GUARDED_BY(send_mu_) = false;
  // Answers of the last message read that Next has not returned yet (the receiver's own).
  ferry::v1::StreamedResults received_;
  int next_received_ = 0;
  absl::Mutex end_mu_;
  bool read_ended_ ABSL_GUARDED_BY(end_mu_) = false;
  std::optional<absl::Status> finished_ ABSL_GUARDED_BY(end_mu_);
};

}  // namespace ferry
