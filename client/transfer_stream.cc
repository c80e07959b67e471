#include "client/transfer_stream.h"

#include <string>
#include <utility>

#include "base/batch_arena.h"

namespace ferry {

TransferStream::~TransferStream() {
  Finish().IgnoreError();
  // A Send blocked in Write returned when Finish cancelled the stream: wait until it is out.
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
  if (!wire_->Write(*request)) {
    return absl::UnavailableError("the transfer stream ended (Finish says why)");
  }
  return absl::OkStatus();
}

absl::Status TransferStream::CloseSend() {
  absl::MutexLock lock(&send_mu_);
  if (send_closed_) return absl::OkStatus();
  send_closed_ = true;
  if (!wire_->WritesDone()) {
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
    if (!wire_->Read(&received_)) {
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
    // Giving up: the agent ends the stream, and what it had still to say is read and
    // dropped (gRPC's Finish wants every message read first).
    wire_->Cancel();
    ferry::v1::StreamedResults dropped;
    while (wire_->Read(&dropped)) {
    }
    read_ended_ = true;
    received_.Clear();
    next_received_ = 0;
  }
  finished_ = wire_->Finish();
  return *finished_;
}

}  // namespace ferry
