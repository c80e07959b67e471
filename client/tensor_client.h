#pragma once
// libferry's tensor API: tagged Send/Recv (rendezvous: the bytes land straight in the
// receiver's buffer), KV-block batches with notifications, cancellation from any thread.
//
//   auto tensors = ferry::TensorClient::Connect("/tmp/ferryd-node-a.sock");
//   auto buf = client->Alloc(4 << 20);                       // ferry::Client, fill it
//   auto meta = ferry::MakeMeta(ferry::v1::DTYPE_FLOAT32, {1024, 1024}, "grad/step-3");
//   tensors->Send(buf->id(), 0, meta, "node-b");
//   // on node-b:
//   auto got = tensors->Recv("node-a", "grad/step-3");       // got->data(), got->meta

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/calls_in_flight.h"
#include "client/ferry_client.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace ferry {

// Cancels a call in progress from another thread (or the next call it is given to, if
// cancelled before it started). The agent then cancels the transfer and tells the peer.
class CallCanceller {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class CallScope;
  mutable absl::Mutex mu_;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

struct CallOptions {
  // The agent's deadline for the whole call (waiting for the peer included).
  absl::Duration timeout = absl::Seconds(60);
  std::shared_ptr<CallCanceller> canceller;  // optional
};

struct RecvOptions {
  uint64_t buffer = 0;  // a named local buffer to land in; 0: the agent allocates one
  uint64_t offset = 0;
  ferry::v1::TensorMeta expect;  // optional dtype / shape the sender must match
};

// A received tensor and the mapped buffer it landed in.
struct ReceivedTensor {
  ferry::v1::TensorMeta meta;
  std::unique_ptr<Buffer> buffer;  // null for a zero-byte tensor without a landing buffer
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool allocated = false;  // the agent allocated `buffer`: free it with Client::Free
  const char* data() const { return buffer ? buffer->data() + offset : nullptr; }
};

struct BlockSpec {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// A stream of notifications (see TensorClient::OpenNotifications).
class NotificationStream {
 public:
  ~NotificationStream();
  // The next notification; nullopt when the stream ended (timeout or max_count).
  absl::StatusOr<std::optional<ferry::v1::Notification>> Next();
  // Ends the stream from another thread.
  void Cancel();

 private:
  friend class TensorClient;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<ferry::v1::Notification>> reader_;
  bool done_ = false;
};

// The same stream on gRPC's callback API (see TensorClient::OpenNotificationReader): no
// thread is blocked on it, and WaitUntil waits only until a deadline, so that a caller that
// must stay responsive (Python, for Ctrl-C) can wait in slices.
class NotificationReader {
 public:
  // Cancels the stream if it is still open.
  ~NotificationReader();
  // True once Next has something to return (a notification or the end); waits for that
  // until `deadline`.
  bool WaitUntil(absl::Time deadline);
  // As NotificationStream::Next; waits without limit when nothing is there yet.
  absl::StatusOr<std::optional<ferry::v1::Notification>> Next();
  // Ends the stream from another thread (Next then reports CANCELLED).
  void Cancel();

 private:
  friend class TensorClient;
  class Reactor;
  explicit NotificationReader(std::shared_ptr<Reactor> reactor) : reactor_(std::move(reactor)) {}
  // Shared with gRPC, which reports to it until the stream's end even after we are gone.
  std::shared_ptr<Reactor> reactor_;
};

// Runs once when an asynchronous call (TensorClient::SendAsync, ...) ends, on one of gRPC's
// threads, or inline on the caller's when the request cannot even be sent. It must not
// block: gRPC's few callback threads end every other call too. Hand the result on instead.
// Nor may it destroy the TensorClient that started it: that waits for its calls to end.
template <typename T>
using CallDone = absl::AnyInvocable<void(absl::StatusOr<T>) &&>;

ferry::v1::TensorMeta MakeMeta(ferry::v1::DType dtype, std::vector<int64_t> shape, std::string tag,
                               std::vector<int64_t> strides = {}, std::string device = "host");

class TensorClient {
 public:
  // Opens a session of its own (see Client::Connect).
  static absl::StatusOr<std::unique_ptr<TensorClient>> Connect(
      const std::string& target, absl::Duration timeout = absl::Seconds(5));
  // On a session opened already (shared with a Client): a receive's landing buffer then
  // belongs to that session.
  explicit TensorClient(std::shared_ptr<AgentSession> session);

  // Sends the tensor at `offset` in local buffer `buffer`; returns once it has landed in the
  // receiver's buffer. meta.tag is the tag.
  absl::StatusOr<ferry::v1::SendResponse> Send(uint64_t buffer, uint64_t offset,
                                               const ferry::v1::TensorMeta& meta,
                                               const std::string& peer,
                                               const CallOptions& options = {});
  absl::StatusOr<ReceivedTensor> Recv(const std::string& peer, const std::string& tag,
                                      const RecvOptions& recv = {},
                                      const CallOptions& options = {});
  // Writes the blocks, then notifies the peer with `notification` (empty: no notification),
  // carrying `notification_payload` (at most 4096 bytes).
  absl::StatusOr<ferry::v1::WriteBlocksResponse> WriteBlocks(
      uint64_t local_buffer, const std::string& peer, const std::string& remote_buffer,
      const std::vector<BlockSpec>& blocks, const std::string& notification,
      const CallOptions& options = {}, const std::string& notification_payload = "");
  // Takes notification `name` (from `from_node` if not empty). A notification of a batch
  // that failed comes back as that error. options.timeout zero (or less): a poll, answered
  // at once with the notification or DEADLINE_EXCEEDED.
  absl::StatusOr<ferry::v1::Notification> WaitNotification(const std::string& name,
                                                           const std::string& from_node = "",
                                                           const CallOptions& options = {});
  // Notifications whose name starts with `prefix`, until `timeout` (zero: until cancelled)
  // or `max_count` (0: unlimited).
  std::unique_ptr<NotificationStream> OpenNotifications(const std::string& prefix,
                                                        absl::Duration timeout,
                                                        uint32_t max_count = 0);
  // Takes every pending notification whose name starts with `prefix` (at most `max_count`;
  // 0: as many as one answer holds, `more` set when others wait), at once, over gRPC. A
  // Client's PollOnSocket is the same in one Unix-socket round trip.
  absl::StatusOr<ferry::v1::PollNotificationsResponse> PollNotifications(
      const std::string& prefix = "", uint32_t max_count = 0);
  absl::StatusOr<ferry::v1::CancelResponse> Cancel(const std::string& peer, const std::string& tag);
  absl::StatusOr<ferry::v1::ListPendingResponse> ListPending();

  // The calls above without a thread waiting on each: they return at once and `done` gets
  // what the blocking form would return. Any number may be outstanding; options.canceller
  // cancels one at the agent (`done` then gets CANCELLED). Those still outstanding when the
  // client goes are cancelled, and the destructor returns once their `done` has run.
  void SendAsync(uint64_t buffer, uint64_t offset, const ferry::v1::TensorMeta& meta,
                 const std::string& peer, const CallOptions& options,
                 CallDone<ferry::v1::SendResponse> done);
  void RecvAsync(const std::string& peer, const std::string& tag, const RecvOptions& recv,
                 const CallOptions& options, CallDone<ReceivedTensor> done);
  void WriteBlocksAsync(uint64_t local_buffer, const std::string& peer,
                        const std::string& remote_buffer, const std::vector<BlockSpec>& blocks,
                        const std::string& notification, const CallOptions& options,
                        CallDone<ferry::v1::WriteBlocksResponse> done,
                        const std::string& notification_payload = "");
  void WaitNotificationAsync(const std::string& name, const std::string& from_node,
                             const CallOptions& options,
                             CallDone<ferry::v1::Notification> done);
  // OpenNotifications on gRPC's callback API. A reader kept past the client reports
  // CANCELLED: the client ended its stream when it went.
  std::unique_ptr<NotificationReader> OpenNotificationReader(const std::string& prefix,
                                                             absl::Duration timeout,
                                                             uint32_t max_count = 0);

 private:
  std::shared_ptr<AgentSession> session_;
  std::unique_ptr<ferry::v1::Tensors::Stub> stub_;
  // Last, so that it goes first: the calls still in flight are cancelled and waited for
  // while the channel is still ours (calls_in_flight.h says why).
  CallsInFlight calls_;
};

}  // namespace ferry
