#include "server/local/session_call.h"

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"

namespace ferry::server {
namespace {

class SessionReactor : public grpc::ServerWriteReactor<ferry::v1::SessionEvent> {
 public:
  SessionReactor(SessionRegistry* sessions, uint64_t id) : sessions_(sessions), id_(id) {
    event_.set_session(id);
    event_.set_incarnation(sessions->incarnation());
    event_.set_started_unix_ms(absl::ToUnixMillis(sessions->started()));
    StartWrite(&event_);
  }

  // The one event is out; the call now stays open, idle, until it is cancelled.
  void OnWriteDone(bool ok) override {
    if (!ok) FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client went away"));
  }
  void OnCancel() override { FinishOnce(grpc::Status::CANCELLED); }
  void OnDone() override {
    sessions_->CloseSoon(id_);  // not here: freeing may call peers (sessions.h says why)
    delete this;
  }

 private:
  // A failed write and the cancel may both want to end the call, on different threads.
  void FinishOnce(const grpc::Status& status) {
    if (!finished_.exchange(true)) Finish(status);
  }

  SessionRegistry* const sessions_;
  std::atomic<bool> finished_{false};
  const uint64_t id_;
  ferry::v1::SessionEvent event_;
};

}  // namespace

grpc::ServerWriteReactor<ferry::v1::SessionEvent>* StartSessionCall(
    SessionRegistry* sessions, const ferry::v1::OpenSessionRequest& request,
    const std::optional<LocalCaller>& caller) {
  const uint32_t pid = caller ? static_cast<uint32_t>(caller->pid) : request.pid();
  const int64_t uid = caller ? static_cast<int64_t>(caller->uid) : -1;
  return new SessionReactor(sessions, sessions->Open(request.client(), pid, uid));
}

absl::StatusOr<uint64_t> SessionOfCall(const grpc::ServerContextBase& ctx,
                                       const SessionRegistry& sessions,
                                       const LocalCallers& callers) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(kSessionMetadata);
  if (it == metadata.end()) return 0;
  absl::StatusOr<uint64_t> id =
      sessions.Resolve(absl::string_view(it->second.data(), it->second.size()));
  if (!id.ok() || *id == 0) return id;
  absl::Status allowed = callers.MayUse(callers.Of(ctx), sessions.UidOf(*id),
                                        absl::StrCat(kSessionMetadata, ": session ", *id));
  if (!allowed.ok()) return allowed;
  return id;
}

absl::StatusOr<uint64_t> SessionOfCaller(uint64_t id, const std::string& field,
                                         const LocalCaller& caller,
                                         const SessionRegistry& sessions,
                                         const LocalCallers& callers) {
  if (id == 0) return 0;
  if (!sessions.IsOpen(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": session ", id, " is not open (it ended)"));
  }
  absl::Status allowed =
      callers.MayUse(caller, sessions.UidOf(id), absl::StrCat(field, ": session ", id));
  if (!allowed.ok()) return allowed;
  return id;
}

}  // namespace ferry::server
