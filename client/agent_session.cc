#include "client/agent_session.h"

#include <unistd.h>

#include <chrono>
#include <future>

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "client/agent_channel.h"
#include "ferry/v1/agent.grpc.pb.h"

namespace ferry {

absl::StatusOr<std::shared_ptr<AgentSession>> AgentSession::Open(const std::string& target,
                                                                 absl::Duration timeout,
                                                                 const std::string& client) {
  auto channel = ConnectAgentChannel(target, timeout);
  if (!channel.ok()) return channel.status();
  std::shared_ptr<AgentSession> session(new AgentSession(*channel));
  ferry::v1::OpenSessionRequest req;
  req.set_client(client);
  req.set_pid(static_cast<uint32_t>(getpid()));
  auto stub = ferry::v1::Agent::NewStub(session->channel_);
  session->reader_ = std::unique_ptr<grpc::ClientReader<ferry::v1::SessionEvent>>(
      stub->OpenSession(&session->call_, req));
  std::promise<absl::StatusOr<uint64_t>> first;
  auto opened = first.get_future();
  // Only the first event is read (the session's id; the agent sends nothing else), on a
  // thread so that Open can give up on an agent that never answers. No read stays pending
  // after it: a thread blocked in a read would be one more poller of gRPC's, and it, not
  // the caller, would then read most calls' answers and hand each over. An idle client's
  // connection is still served (the agent's keepalive pings acked, its GOAWAY seen): gRPC's
  // client channels poll every 5 s when no call does (its backup poller; strace shows it).
  session->first_reader_ = std::thread([session = session.get(),
                                        first = std::move(first)]() mutable {
    ferry::v1::SessionEvent event;
    if (session->reader_->Read(&event)) {
      first.set_value(event.session());
      return;
    }
    absl::Status why = FromGrpcStatus(session->reader_->Finish());
    session->finished_ = true;
    first.set_value(why.ok() ? absl::UnavailableError("OpenSession ended without a session id")
                             : why);
  });
  if (opened.wait_for(std::chrono::microseconds(absl::ToInt64Microseconds(timeout))) !=
      std::future_status::ready) {
    return absl::UnavailableError(absl::StrCat(
        "ferryd at ", target, " did not open a session within ", absl::FormatDuration(timeout)));
    // `session` goes: its destructor cancels the call and joins the reader.
  }
  auto id = opened.get();
  if (!id.ok()) {
    return absl::Status(id.status().code(), absl::StrCat("OpenSession: ", id.status().message()));
  }
  session->id_ = *id;
  return session;
}

AgentSession::~AgentSession() {
  call_.TryCancel();
  if (first_reader_.joinable()) first_reader_.join();
  if (!finished_) reader_->Finish().IgnoreError();  // CANCELLED: it ends at once
}

void AgentSession::Attach(grpc::ClientContext* ctx) const {
  ctx->AddMetadata("ferry-session", absl::StrCat(id_));
}

}  // namespace ferry
