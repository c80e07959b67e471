#include "client/agent_session.h"

#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "client/agent_channel.h"

namespace ferry {

// The OpenSession call. gRPC calls OnReadDone and OnDone on its own threads; the session's
// owner waits for the first event (First) and, going, for the end (Close).
class AgentSession::Watch : public grpc::ClientReadReactor<ferry::v1::SessionEvent> {
 public:
  Watch(const std::shared_ptr<grpc::Channel>& channel, const std::string& client)
      : stub_(ferry::v1::Agent::NewStub(channel)) {
    request_.set_client(client);
    request_.set_pid(static_cast<uint32_t>(getpid()));
    stub_->async()->OpenSession(&context_, &request_, this);
    // Only the first event is read (the agent sends nothing else). No read stays pending
    // after it, yet OnDone comes when the call ends: the agent went away, or Close.
    StartRead(&event_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (ok) first_ = event_;
    read_done_ = true;
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    absl::Status why = FromGrpcStatus(status);
    ended_ = why.ok() ? absl::UnavailableError("the agent ended the session") : why;
    done_ = true;
  }

  // The first event, once it came (waiting up to `timeout`); the call's end if it ended
  // without one; nullopt if neither happened in time.
  std::optional<absl::StatusOr<ferry::v1::SessionEvent>> First(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto answered = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return read_done_ || done_; };
    mu_.AwaitWithTimeout(absl::Condition(&answered), timeout);
    if (first_) return *first_;
    if (done_) return ended_;
    if (read_done_) return absl::UnavailableError("OpenSession ended without a session id");
    return std::nullopt;
  }

  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  bool AwaitDone(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }
  absl::Status ended() const {
    absl::MutexLock lock(&mu_);
    return done_ ? ended_ : absl::OkStatus();
  }

  // Ends the call (the agent frees the session) and returns once gRPC is done with it.
  void Close() {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

 private:
  std::unique_ptr<ferry::v1::Agent::Stub> stub_;
  grpc::ClientContext context_;
  ferry::v1::OpenSessionRequest request_;
  ferry::v1::SessionEvent event_;
  mutable absl::Mutex mu_;
  std::optional<ferry::v1::SessionEvent> first_ ABSL_GUARDED_BY(mu_);
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
};

AgentSession::AgentSession(std::shared_ptr<grpc::Channel> channel) : channel_(std::move(channel)) {}

absl::StatusOr<std::shared_ptr<AgentSession>> AgentSession::Open(const std::string& target,
                                                                 absl::Duration timeout,
                                                                 const std::string& client) {
  auto channel = ConnectAgentChannel(target, timeout);
  if (!channel.ok()) return channel.status();
  std::shared_ptr<AgentSession> session(new AgentSession(*channel));
  session->watch_ = std::make_unique<Watch>(session->channel_, client);
  auto first = session->watch_->First(timeout);
  if (!first) {
    return absl::UnavailableError(absl::StrCat(
        "ferryd at ", target, " did not open a session within ", absl::FormatDuration(timeout)));
    // `session` goes: its destructor cancels the call and waits for its end.
  }
  if (!first->ok()) {
    return absl::Status(first->status().code(),
                        absl::StrCat("OpenSession: ", first->status().message()));
  }
  session->id_ = (*first)->session();
  session->incarnation_ = (*first)->incarnation();
  session->agent_started_ = absl::FromUnixMillis((*first)->started_unix_ms());
  return session;
}

AgentSession::~AgentSession() {
  if (watch_) watch_->Close();
}

bool AgentSession::alive() const { return watch_ != nullptr && !watch_->done(); }

absl::Status AgentSession::ended() const {
  return watch_ == nullptr ? absl::OkStatus() : watch_->ended();
}

bool AgentSession::AwaitEnd(absl::Duration timeout) const {
  return watch_ == nullptr || watch_->AwaitDone(timeout);
}

void AgentSession::Attach(grpc::ClientContext* ctx) const {
  ctx->AddMetadata("ferry-session", absl::StrCat(id_));
}

}  // namespace ferry
