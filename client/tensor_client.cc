#include "client/tensor_client.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "client/agent_channel.h"
#include "grpcpp/grpcpp.h"

namespace ferry {

// Attaches a ClientContext to a canceller for the duration of one call.
class CallScope {
 public:
  CallScope(const CallOptions& options, grpc::ClientContext* ctx) : canceller_(options.canceller) {
    // The agent enforces `timeout` and says so in words; the gRPC deadline only guards
    // against an agent that stopped answering.
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + options.timeout + absl::Seconds(5)));
    if (canceller_) {
      absl::MutexLock lock(&canceller_->mu_);
      canceller_->ctx_ = ctx;
      if (canceller_->cancelled_) ctx->TryCancel();
    }
  }
  ~CallScope() {
    if (canceller_) {
      absl::MutexLock lock(&canceller_->mu_);
      canceller_->ctx_ = nullptr;
    }
  }

 private:
  std::shared_ptr<CallCanceller> canceller_;
};

namespace {

// The request field is uint32 ms: a longer timeout (absl::InfiniteDuration() included)
// becomes its largest value, about 49.7 days.
uint32_t TimeoutMs(const CallOptions& options) {
  int64_t ms = absl::ToInt64Milliseconds(options.timeout);
  return static_cast<uint32_t>(std::clamp<int64_t>(ms, 1, UINT32_MAX));
}

// The requests, built once for the blocking and the asynchronous form of each call.
ferry::v1::SendRequest SendRequestFor(uint64_t buffer, uint64_t offset,
                                      const ferry::v1::TensorMeta& meta, const std::string& peer,
                                      const CallOptions& options) {
  ferry::v1::SendRequest req;
  req.set_buffer(buffer);
  req.set_offset(offset);
  *req.mutable_meta() = meta;
  req.set_peer(peer);
  req.set_timeout_ms(TimeoutMs(options));
  return req;
}

ferry::v1::RecvRequest RecvRequestFor(const std::string& peer, const std::string& tag,
                                      const RecvOptions& recv, const CallOptions& options) {
  ferry::v1::RecvRequest req;
  req.set_peer(peer);
  req.set_tag(tag);
  req.set_buffer(recv.buffer);
  req.set_offset(recv.offset);
  *req.mutable_expect() = recv.expect;
  req.set_timeout_ms(TimeoutMs(options));
  return req;
}

ferry::v1::WriteBlocksRequest WriteBlocksRequestFor(uint64_t local_buffer, const std::string& peer,
                                                    const std::string& remote_buffer,
                                                    const std::vector<BlockSpec>& blocks,
                                                    const std::string& notification,
                                                    const std::string& notification_payload,
                                                    const CallOptions& options) {
  ferry::v1::WriteBlocksRequest req;
  req.set_local_buffer(local_buffer);
  req.set_peer(peer);
  req.set_remote_buffer(remote_buffer);
  req.mutable_blocks()->Reserve(static_cast<int>(blocks.size()));
  for (const BlockSpec& b : blocks) {
    auto* block = req.add_blocks();
    block->set_local_offset(b.local_offset);
    block->set_remote_offset(b.remote_offset);
    block->set_length(b.length);
  }
  req.set_notification(notification);
  req.set_notification_payload(notification_payload);
  req.set_timeout_ms(TimeoutMs(options));
  return req;
}

ferry::v1::WaitNotificationRequest WaitNotificationRequestFor(const std::string& name,
                                                              const std::string& from_node,
                                                              const CallOptions& options) {
  ferry::v1::WaitNotificationRequest req;
  req.set_name(name);
  req.set_from_node(from_node);
  req.set_timeout_ms(TimeoutMs(options));
  req.set_poll(options.timeout <= absl::ZeroDuration());
  return req;
}

// A receive's answer with its landing buffer mapped into this process.
absl::StatusOr<ReceivedTensor> ToReceivedTensor(const ferry::v1::RecvResponse& resp) {
  ReceivedTensor out;
  out.meta = resp.meta();
  out.offset = resp.offset();
  out.bytes = resp.bytes();
  out.allocated = resp.allocated();
  if (resp.has_buffer()) {
    auto mapped = Buffer::Map(resp.buffer());
    if (!mapped.ok()) return mapped.status();
    out.buffer = *std::move(mapped);
  }
  return out;
}

// A unary call the agent answers at once (`call(ctx, &response)`): its deadline only bounds
// an agent that stopped answering.
template <typename Response, typename Call>
absl::StatusOr<Response> PromptCall(Call call) {
  Response resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = call(&ctx, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

template <typename T>
absl::StatusOr<T> Itself(T& resp) {
  return std::move(resp);
}

// One unary call on gRPC's callback API. gRPC needs the context, request and response until
// the call ends, so they live here, kept by the completion callback until it has run.
template <typename Request, typename Response, typename Result>
struct AsyncUnary {
  explicit AsyncUnary(CallsInFlight& calls) : hold(calls) {}

  CallsInFlight::Hold hold;  // first, so that it goes last: after ctx and its channel reference
  grpc::ClientContext ctx;
  Request req;
  Response resp;
  std::optional<CallScope> scope;
  CallDone<Result> done;
};

// Starts `start` (one of Stub::async()'s methods) on `req`; `convert` makes the result
// from the response. `session`, when set, names the call's session (see AgentSession).
template <typename Response, typename Result, typename Request, typename Start,
          typename Convert>
void StartUnary(CallsInFlight& calls, Request req, const CallOptions& options,
                const AgentSession* session, Start start, Convert convert,
                CallDone<Result> done) {
  auto call = std::make_shared<AsyncUnary<Request, Response, Result>>(calls);
  call->req = std::move(req);
  call->done = std::move(done);
  if (session != nullptr) session->Attach(&call->ctx);
  call->scope.emplace(options, &call->ctx);
  call->hold.Started(&call->ctx);
  start(&call->ctx, &call->req, &call->resp, [call, convert](grpc::Status s) {
    // First: from here on no canceller may reach the context (it may go with `call`).
    call->scope.reset();
    call->hold.Ended();
    absl::StatusOr<Result> r =
        s.ok() ? convert(call->resp) : absl::StatusOr<Result>(FromGrpcStatus(s));
    std::move(call->done)(std::move(r));
  });
}

}  // namespace

void CallCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (ctx_ != nullptr) ctx_->TryCancel();
}

bool CallCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

ferry::v1::TensorMeta MakeMeta(ferry::v1::DType dtype, std::vector<int64_t> shape, std::string tag,
                               std::vector<int64_t> strides, std::string device) {
  ferry::v1::TensorMeta meta;
  meta.set_dtype(dtype);
  for (int64_t d : shape) meta.add_shape(d);
  for (int64_t s : strides) meta.add_strides(s);
  meta.set_tag(std::move(tag));
  meta.set_device(std::move(device));
  return meta;
}

absl::StatusOr<std::unique_ptr<TensorClient>> TensorClient::Connect(const std::string& target,
                                                                    absl::Duration timeout) {
  auto session = AgentSession::Open(target, timeout, "libferry tensors");
  if (!session.ok()) return session.status();
  return std::make_unique<TensorClient>(*std::move(session));
}

TensorClient::TensorClient(std::shared_ptr<AgentSession> session)
    : session_(std::move(session)), stub_(ferry::v1::Tensors::NewStub(session_->channel())) {}

absl::StatusOr<ferry::v1::SendResponse> TensorClient::Send(uint64_t buffer, uint64_t offset,
                                                           const ferry::v1::TensorMeta& meta,
                                                           const std::string& peer,
                                                           const CallOptions& options) {
  ferry::v1::SendRequest req = SendRequestFor(buffer, offset, meta, peer, options);
  ferry::v1::SendResponse resp;
  grpc::ClientContext ctx;
  CallScope scope(options, &ctx);
  grpc::Status s = stub_->Send(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<ReceivedTensor> TensorClient::Recv(const std::string& peer, const std::string& tag,
                                                  const RecvOptions& recv,
                                                  const CallOptions& options) {
  ferry::v1::RecvRequest req = RecvRequestFor(peer, tag, recv, options);
  ferry::v1::RecvResponse resp;
  grpc::ClientContext ctx;
  session_->Attach(&ctx);  // a landing buffer the agent allocates becomes ours
  CallScope scope(options, &ctx);
  grpc::Status s = stub_->Recv(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return ToReceivedTensor(resp);
}

absl::StatusOr<ferry::v1::WriteBlocksResponse> TensorClient::WriteBlocks(
    uint64_t local_buffer, const std::string& peer, const std::string& remote_buffer,
    const std::vector<BlockSpec>& blocks, const std::string& notification,
    const CallOptions& options, const std::string& notification_payload) {
  ferry::v1::WriteBlocksRequest req = WriteBlocksRequestFor(
      local_buffer, peer, remote_buffer, blocks, notification, notification_payload, options);
  ferry::v1::WriteBlocksResponse resp;
  grpc::ClientContext ctx;
  CallScope scope(options, &ctx);
  grpc::Status s = stub_->WriteBlocks(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<ferry::v1::Notification> TensorClient::WaitNotification(const std::string& name,
                                                                       const std::string& from_node,
                                                                       const CallOptions& options) {
  ferry::v1::WaitNotificationRequest req = WaitNotificationRequestFor(name, from_node, options);
  ferry::v1::Notification resp;
  grpc::ClientContext ctx;
  CallScope scope(options, &ctx);
  grpc::Status s = stub_->WaitNotification(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<ferry::v1::PollNotificationsResponse> TensorClient::PollNotifications(
    const std::string& prefix, uint32_t max_count) {
  ferry::v1::PollNotificationsRequest req;
  req.set_prefix(prefix);
  req.set_max_count(max_count);
  return PromptCall<ferry::v1::PollNotificationsResponse>(
      [&](grpc::ClientContext* ctx, ferry::v1::PollNotificationsResponse* resp) {
        return stub_->PollNotifications(ctx, req, resp);
      });
}

void TensorClient::SendAsync(uint64_t buffer, uint64_t offset, const ferry::v1::TensorMeta& meta,
                             const std::string& peer, const CallOptions& options,
                             CallDone<ferry::v1::SendResponse> done) {
  StartUnary<ferry::v1::SendResponse, ferry::v1::SendResponse>(
      calls_, SendRequestFor(buffer, offset, meta, peer, options), options, nullptr,
      [this](auto* ctx, auto* req, auto* resp, std::function<void(grpc::Status)> end) {
        stub_->async()->Send(ctx, req, resp, std::move(end));
      },
      Itself<ferry::v1::SendResponse>, std::move(done));
}

void TensorClient::RecvAsync(const std::string& peer, const std::string& tag,
                             const RecvOptions& recv, const CallOptions& options,
                             CallDone<ReceivedTensor> done) {
  // As Recv: the session is named so that a landing buffer the agent allocates is ours.
  StartUnary<ferry::v1::RecvResponse, ReceivedTensor>(
      calls_, RecvRequestFor(peer, tag, recv, options), options, session_.get(),
      [this](auto* ctx, auto* req, auto* resp, std::function<void(grpc::Status)> end) {
        stub_->async()->Recv(ctx, req, resp, std::move(end));
      },
      ToReceivedTensor, std::move(done));
}

void TensorClient::WriteBlocksAsync(uint64_t local_buffer, const std::string& peer,
                                    const std::string& remote_buffer,
                                    const std::vector<BlockSpec>& blocks,
                                    const std::string& notification, const CallOptions& options,
                                    CallDone<ferry::v1::WriteBlocksResponse> done,
                                    const std::string& notification_payload) {
  StartUnary<ferry::v1::WriteBlocksResponse, ferry::v1::WriteBlocksResponse>(
      calls_,
      WriteBlocksRequestFor(local_buffer, peer, remote_buffer, blocks, notification,
                            notification_payload, options),
      options, nullptr,
      [this](auto* ctx, auto* req, auto* resp, std::function<void(grpc::Status)> end) {
        stub_->async()->WriteBlocks(ctx, req, resp, std::move(end));
      },
      Itself<ferry::v1::WriteBlocksResponse>, std::move(done));
}

void TensorClient::WaitNotificationAsync(const std::string& name, const std::string& from_node,
                                         const CallOptions& options,
                                         CallDone<ferry::v1::Notification> done) {
  StartUnary<ferry::v1::Notification, ferry::v1::Notification>(
      calls_, WaitNotificationRequestFor(name, from_node, options), options, nullptr,
      [this](auto* ctx, auto* req, auto* resp, std::function<void(grpc::Status)> end) {
        stub_->async()->WaitNotification(ctx, req, resp, std::move(end));
      },
      Itself<ferry::v1::Notification>, std::move(done));
}

NotificationStream::~NotificationStream() {
  if (reader_ && !done_) {
    ctx_.TryCancel();
    reader_->Finish().ok();
  }
}

absl::StatusOr<std::optional<ferry::v1::Notification>> NotificationStream::Next() {
  if (done_) return std::nullopt;
  ferry::v1::Notification n;
  if (reader_->Read(&n)) return n;
  done_ = true;
  grpc::Status s = reader_->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  return std::nullopt;
}

void NotificationStream::Cancel() { ctx_.TryCancel(); }

namespace {

// The stream request, and its gRPC deadline on `ctx` (zero `timeout`: until cancelled).
ferry::v1::StreamNotificationsRequest StreamRequestFor(const std::string& prefix,
                                                       absl::Duration timeout,
                                                       uint32_t max_count,
                                                       grpc::ClientContext* ctx) {
  ferry::v1::StreamNotificationsRequest req;
  req.set_prefix(prefix);
  req.set_max_count(max_count);
  if (timeout > absl::ZeroDuration()) {
    req.set_timeout_ms(static_cast<uint32_t>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 1, UINT32_MAX)));
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
  }
  return req;
}

}  // namespace

std::unique_ptr<NotificationStream> TensorClient::OpenNotifications(const std::string& prefix,
                                                                    absl::Duration timeout,
                                                                    uint32_t max_count) {
  auto stream = std::unique_ptr<NotificationStream>(new NotificationStream());
  ferry::v1::StreamNotificationsRequest req =
      StreamRequestFor(prefix, timeout, max_count, &stream->ctx_);
  stream->reader_ = stub_->StreamNotifications(&stream->ctx_, req);
  return stream;
}

// Reads ahead at most kReadAhead notifications: when the consumer stops taking them the
// reads stop too, and the agent's stream waits (HTTP/2 flow control) instead of our memory
// growing.
class NotificationReader::Reactor : public grpc::ClientReadReactor<ferry::v1::Notification> {
 public:
  static constexpr size_t kReadAhead = 64;

  // Starts the stream; it keeps itself alive until gRPC reported its end (OnDone), and is
  // one of `calls` until then.
  void Start(CallsInFlight& calls, ferry::v1::Tensors::Stub* stub, const std::string& prefix,
             absl::Duration timeout, uint32_t max_count, const std::shared_ptr<Reactor>& self) {
    self_ = self;
    hold_.emplace(calls);
    {
      absl::MutexLock lock(&mu_);
      req_ = StreamRequestFor(prefix, timeout, max_count, &*ctx_);
      hold_->Started(&*ctx_);
      stub->async()->StreamNotifications(&*ctx_, &req_, this);  // StartCall starts it
    }
    StartRead(&incoming_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    bool more;
    {
      absl::MutexLock lock(&mu_);
      ready_.push_back(std::move(incoming_));
      more = ready_.size() < kReadAhead;
      reading_ = more;
    }
    if (more) {
      StartRead(&incoming_);
    } else {
      AddHold();  // no read in flight: without a hold, the stream could end under Next
    }
  }

  void OnDone(const grpc::Status& s) override {
    std::shared_ptr<Reactor> last = std::move(self_);  // this may go when `last` does
    hold_->Ended();
    {
      absl::MutexLock lock(&mu_);
      end_ = FromGrpcStatus(s);
      ended_ = true;
      // The context goes now, not with the reactor (a NotificationReader may keep that past
      // its client): its channel reference must be gone before the hold is (CallsInFlight).
      ctx_.reset();
    }
    hold_.reset();
  }

  bool WaitUntil(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(this, &Reactor::ReadyLocked), deadline);
    return ReadyLocked();
  }

  absl::StatusOr<std::optional<ferry::v1::Notification>> Next() {
    ferry::v1::Notification n;
    bool resume = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Reactor::ReadyLocked));
      if (ready_.empty()) {
        if (!end_.ok()) return end_;
        return std::nullopt;
      }
      n = std::move(ready_.front());
      ready_.pop_front();
      resume = !reading_ && !ended_;
      if (resume) reading_ = true;
    }
    // Outside the lock: gRPC may report the read on this thread.
    if (resume) {
      StartRead(&incoming_);
      RemoveHold();
    }
    return n;
  }

  void Cancel() {
    absl::MutexLock lock(&mu_);
    if (!ended_) ctx_->TryCancel();  // never reports inline (see CallsInFlight::EndAll)
  }

 private:
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_ || !ready_.empty(); }

  std::optional<CallsInFlight::Hold> hold_;  // from Start until OnDone
  ferry::v1::StreamNotificationsRequest req_;
  ferry::v1::Notification incoming_;  // the read in flight writes here
  std::shared_ptr<Reactor> self_;
  absl::Mutex mu_;
  std::optional<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_){std::in_place};  // until OnDone
  std::deque<ferry::v1::Notification> ready_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = true;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_ ABSL_GUARDED_BY(mu_);
};

NotificationReader::~NotificationReader() { reactor_->Cancel(); }

bool NotificationReader::WaitUntil(absl::Time deadline) { return reactor_->WaitUntil(deadline); }

absl::StatusOr<std::optional<ferry::v1::Notification>> NotificationReader::Next() {
  return reactor_->Next();
}

void NotificationReader::Cancel() { reactor_->Cancel(); }

std::unique_ptr<NotificationReader> TensorClient::OpenNotificationReader(const std::string& prefix,
                                                                         absl::Duration timeout,
                                                                         uint32_t max_count) {
  auto reactor = std::make_shared<NotificationReader::Reactor>();
  reactor->Start(calls_, stub_.get(), prefix, timeout, max_count, reactor);
  return std::unique_ptr<NotificationReader>(new NotificationReader(std::move(reactor)));
}

absl::StatusOr<ferry::v1::CancelResponse> TensorClient::Cancel(const std::string& peer,
                                                               const std::string& tag) {
  ferry::v1::CancelRequest req;
  req.set_peer(peer);
  req.set_tag(tag);
  return PromptCall<ferry::v1::CancelResponse>(
      [&](grpc::ClientContext* ctx, ferry::v1::CancelResponse* resp) {
        return stub_->Cancel(ctx, req, resp);
      });
}

absl::StatusOr<ferry::v1::ListPendingResponse> TensorClient::ListPending() {
  return PromptCall<ferry::v1::ListPendingResponse>(
      [&](grpc::ClientContext* ctx, ferry::v1::ListPendingResponse* resp) {
        return stub_->ListPending(ctx, {}, resp);
      });
}

}  // namespace ferry
