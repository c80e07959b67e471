#include "client/transfer_stream.h"

#include <string>
#include <utility>

#include "base/batch_arena.h"
#include "base/grpc_status.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<TransferStream>> TransferStream::Open(
    ferry::v1::Agent::Stub& stub, std::unique_ptr<grpc::ClientContext> ctx) {
  auto call = stub.TransferStream(ctx.get());
  if (call == nullptr) return absl::InternalError("TransferStream: gRPC gave no call");
  return std::unique_ptr<TransferStream>(new TransferStream(std::move(ctx), std::move(call)));
}

TransferStream::TransferStream(
    std::unique_ptr<grpc::ClientContext> ctx,
    std::unique_ptr<grpc::ClientReaderWriter<ferry::v1::StreamedTransfer,
                                             ferry::v1::StreamedResults>> call)
    : ctx_(std::move(ctx)), call_(std::move(call)) {}

TransferStream::~TransferStream() {
  Finish().IgnoreError();
  // A Send blocked in Write returned when Finish cancelled the call: wait until it is out.
  absl::MutexLock lock(&send_mu_);
}

absl::Status TransferStream::Send(uint64_t tag, const std::vector<OpSpec>& ops,
                                  absl::Duration timeout, bool include_ops) {
  google::protobuf::Arena arena(BatchArenaOptions());
  auto* request = google::protobuf::Arena::CreateMessage<ferry::v1::StreamedTransfer>(&arena);
  request->set_tag(tag);
  FillSubmitRequest(ops, timeout, request->mutable_transfer()->mutable_submit());
  request->mutable_transfer()->set_include_ops(include_ops);
  absl::MutexLock lock(&send_mu_);
  if (send_closed_) return absl::FailedPreconditionError("Send after CloseSend");
  if (!call_->Write(*request)) {
    return absl::UnavailableError("the transfer stream ended (Finish says why)");
  }
  return absl::OkStatus();
}

absl::Status TransferStream::CloseSend() {
  absl::MutexLock lock(&send_mu_);
  if (send_closed_) return absl::OkStatus();
  send_closed_ = true;
  if (!call_->WritesDone()) {
    return absl::UnavailableError("the transfer stream ended (Finish says why)");
  }
  return absl::OkStatus();
}

absl::StatusOr<TransferStream::Answer> TransferStream::Next() {
  {
    absl::MutexLock lock(&end_mu_);
    if (read_ended_) return absl::OutOfRangeError("the transfer stream ended (Finish says how)");
  }
  // Several answers may come in one message: read one when those are used up (a message
  // with none is not sent, but would only mean reading on).
  while (next_received_ >= received_.results_size()) {
    next_received_ = 0;
    if (!call_->Read(&received_)) {
      received_.Clear();
      absl::MutexLock lock(&end_mu_);
      read_ended_ = true;
      return absl::OutOfRangeError("the transfer stream ended (Finish says how)");
    }
  }
  ferry::v1::StreamedResult& message = *received_.mutable_results(next_received_++);
  Answer answer;
  answer.tag = message.tag();
  if (message.code() != 0) {
    answer.result = absl::Status(static_cast<absl::StatusCode>(message.code()), message.message());
  } else {
    answer.result = std::move(*message.mutable_result());
  }
  return answer;
}

absl::Status TransferStream::Finish() {
  absl::MutexLock lock(&end_mu_);
  if (finished_) return *finished_;
  if (!read_ended_) {
    // Giving up: the agent ends the call, and what it had still to say is read and dropped
    // (gRPC's Finish wants every message read first).
    ctx_->TryCancel();
    ferry::v1::StreamedResults dropped;
    while (call_->Read(&dropped)) {
    }
    read_ended_ = true;
    received_.Clear();
    next_received_ = 0;
  }
  finished_ = FromGrpcStatus(call_->Finish());
  return *finished_;
}

}  // namespace ferry
