// Many transfers over one stream, for a caller that issues many small ones: Send starts
// one without waiting, Next returns the answers in the order the transfers end, each with
// the tag it was sent with. The stream is a connection of its own to the agent's transfer
// socket where the client reaches it, else an Agent.TransferStream call (client/stream_wire.h).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ferry_client.h"
#include "client/stream_wire.h"

namespace ferry {

class TransferStream {
 public:
  struct Answer {
    uint64_t tag = 0;
    // What Client::Run would have returned: the transfer's result (its state says whether
    // every op landed), or why the request was refused and nothing moved.
    absl::StatusOr<ferry::v1::TransferResult> result;
  };

  explicit TransferStream(std::unique_ptr<StreamWire> wire) : wire_(std::move(wire)) {}
  // Cancels the call if it still runs: transfers already sent run on in the agent. A Send
  // blocked on another thread returns first; none may start after.
  ~TransferStream();

  // Sends transfer `tag` (the caller's: its answer carries it). The agent reads at most
  // 1024 requests ahead of the answers it has written; past that, requests wait in the
  // socket's buffer or the call's flow-control window, and Send blocks once that is full: a
  // caller that sends without reading answers is held back. UNAVAILABLE once the stream
  // broke (Finish says why).
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
  const std::unique_ptr<StreamWire> wire_;
  // One sender and one receiver may work at once (a Write beside a Read); the end of the
  // stream is decided once.
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
